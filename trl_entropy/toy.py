"""An offline toy task: tiny tokenizer, tiny causal LM, verifiable arithmetic, binary reward.

Everything here is built from code, never downloaded, so tests and examples run on any machine (no Hugging Face Hub
access, CPU only) in seconds:

* :func:`build_toy_tokenizer`: a character-level ``PreTrainedTokenizerFast`` over a small alphabet.
* :func:`build_toy_model`: a randomly initialised two-layer Llama-architecture causal LM sized to that tokenizer.
* :func:`build_toy_dataset`: two-operand arithmetic prompts such as ``"7+12="`` with their answers (``"19"``), in
  disjoint ``"train"`` and ``"test"`` splits; addition by default, subtraction or multiplication on request
  (``operators=("-",)``), which gives a second task on the same tokenizer.
* :func:`toy_reward`: a TRL reward function (binary: 1.0 for the exact answer, else 0.0).
* :func:`warm_start`: a short supervised fit so that reinforcement learning starts from a policy that succeeds *some*
  of the time when sampling at temperature 1 (no success, or constant success, would give GRPO no advantage signal).
* :func:`build_toy_policy`: the model and tokenizer, built and warm-started, optionally cached on disk.
* :func:`toy_success_rate`: the sampled success rate on held-out prompts.
* ``TOY_TRAINING_DEFAULTS`` and :func:`toy_training_set`: the training recipe of `examples/train.py` without a model
  and of the entropy-collapse demo.

Quick start::

    from trl import GRPOConfig, GRPOTrainer
    from trl_entropy.toy import build_toy_dataset, build_toy_policy, toy_reward

    model, tokenizer = build_toy_policy(cache_dir="/tmp/toy_policy")
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=toy_reward,
        args=GRPOConfig(output_dir="/tmp/out", use_cpu=True, max_completion_length=8, num_generations=4, ...),
        train_dataset=build_toy_dataset(256),
    )
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import shutil
import tempfile
from pathlib import Path

import torch


__all__ = [
    "TOY_ALPHABET",
    "TOY_BOS_TOKEN",
    "TOY_EOS_TOKEN",
    "TOY_MAX_OPERAND",
    "TOY_MODEL_MAX_LENGTH",
    "TOY_NUM_PROMPTS",
    "TOY_OPERATORS",
    "TOY_PAD_TOKEN",
    "TOY_TRAINING_DEFAULTS",
    "TOY_UNK_TOKEN",
    "TOY_WARM_START_STEPS",
    "build_toy_dataset",
    "build_toy_model",
    "build_toy_policy",
    "build_toy_tokenizer",
    "cpu_path",
    "toy_problems",
    "toy_reward",
    "toy_success_rate",
    "toy_training_set",
    "torch_single_thread",
    "warm_start",
]

# ---------------------------------------------------------------------------------------------------------------------
# Task definition
# ---------------------------------------------------------------------------------------------------------------------

TOY_PAD_TOKEN = "<pad>"
TOY_BOS_TOKEN = "<bos>"
TOY_EOS_TOKEN = "<eos>"
TOY_UNK_TOKEN = "<unk>"
_SPECIAL_TOKENS = (TOY_PAD_TOKEN, TOY_BOS_TOKEN, TOY_EOS_TOKEN, TOY_UNK_TOKEN)  # ids 0, 1, 2, 3

# Digits, the operators, "=" and space are what the task uses; lowercase letters are there so that prompts can carry a
# few words (e.g. "q: 3+4=") without hitting <unk>.
TOY_ALPHABET = "0123456789+-*= abcdefghijklmnopqrstuvwxyz:?"
TOY_MODEL_MAX_LENGTH = 64

# Problem space: "a<op>b=" with 0 <= a, b <= TOY_MAX_OPERAND. Chosen together with TOY_WARM_START_STEPS so that the
# warm-started policy sits mid-way: about 45-50% success on held-out prompts sampling at temperature 1 (seeds 0-3),
# about 75% greedy. Larger spaces (operands up to 29, or "+" and "-" up to 19) learn slower: about 20-30% after 300-400
# steps.
TOY_MAX_OPERAND = 19
TOY_OPERATORS = ("+",)
_OPERATOR_NAMES = {"+": "add", "-": "sub", "*": "mul"}  # the cache folder names an operator set by these
TOY_TEST_FRACTION = 0.2
_SPLIT_SEED = 20240601  # fixes the train/test partition independently of any user seed

TOY_WARM_START_STEPS = 300
_WARM_START_LR = 3e-3
_WARM_START_BATCH_SIZE = 64
_CACHE_FORMAT_VERSION = 1  # bump whenever the tokenizer, model, task or warm start changes


def _apply(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"Unsupported operator {op!r}")


def _check_operators(operators) -> tuple[str, ...]:
    operators = tuple(operators)
    if not operators or len(set(operators)) != len(operators) or any(op not in _OPERATOR_NAMES for op in operators):
        raise ValueError(
            f"operators must be distinct operators among {sorted(_OPERATOR_NAMES)}, at least one, got {operators!r}"
        )
    return operators


def toy_problems(split: str = "train", operators: tuple[str, ...] = TOY_OPERATORS) -> list[tuple[str, str]]:
    """Return every ``(prompt, answer)`` pair of a split of the toy task, in a fixed order.

    The problem space of one operator (``f"{a}{op}{b}="`` with ``0 <= a, b <= TOY_MAX_OPERAND``: 400 problems) is
    shuffled once with a fixed seed and cut into a held-out ``"test"`` part (``TOY_TEST_FRACTION`` of it, 80
    problems) and a ``"train"`` part (320), so the two splits never share a prompt. With several ``operators``
    (default: only ``"+"``) the per-operator lists are concatenated in the given order, so an operator's split is
    the same whichever others come with it. ``split="all"`` returns the whole space.
    """
    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
    problems = []
    for op in _check_operators(operators):
        space = [
            (f"{a}{op}{b}=", str(_apply(a, op, b)))
            for a in range(TOY_MAX_OPERAND + 1)
            for b in range(TOY_MAX_OPERAND + 1)
        ]
        random.Random(_SPLIT_SEED).shuffle(space)
        n_test = int(round(len(space) * TOY_TEST_FRACTION))
        problems += {"test": space[:n_test], "train": space[n_test:], "all": space}[split]
    return problems


def _sample_problems(n: int, seed: int, split: str, operators: tuple[str, ...]) -> list[tuple[str, str]]:
    pool = toy_problems(split, operators)
    rng = random.Random(seed)
    if n <= len(pool):
        return rng.sample(pool, n)
    return [rng.choice(pool) for _ in range(n)]


def build_toy_dataset(n: int, seed: int = 0, split: str = "train", operators: tuple[str, ...] = TOY_OPERATORS):
    """Return a ``datasets.Dataset`` of ``n`` toy arithmetic problems with columns ``"prompt"`` and ``"answer"``.

    Prompts are plain (non-conversational) strings such as ``"7+12="``; answers are the decimal result as a string
    (``"19"``, ``"-3"`` for a subtraction). Problems are drawn from ``split`` (``"train"``, ``"test"`` or ``"all"``)
    of the ``operators``' problems (see :func:`toy_problems`) with ``seed``: without replacement when ``n`` fits in
    the split, with replacement otherwise.
    The ``"answer"`` column reaches :func:`toy_reward` as a keyword argument inside ``GRPOTrainer``.
    """
    from datasets import Dataset

    problems = _sample_problems(n, seed, split, operators)
    return Dataset.from_dict({"prompt": [p for p, _ in problems], "answer": [a for _, a in problems]})


def toy_reward(completions: list, answer: list[str], **kwargs) -> list[float]:
    """TRL reward function for the toy task: 1.0 when a completion is exactly the answer, else 0.0.

    ``completions`` are the decoded completions (strings; a conversational ``[{"content": ...}]`` list is accepted
    too) and ``answer`` the dataset column of the same length; other columns and trainer extras arrive in ``kwargs``
    and are ignored. Each completion is cut at the first ``TOY_EOS_TOKEN`` (TRL already drops it when decoding with
    ``skip_special_tokens=True``, but raw decodes keep it), stripped of surrounding whitespace and compared with the
    stripped answer. The reward is deliberately binary (no partial credit for a close number or a right prefix):
    it is the verifiable success signal the entropy-control methods are studied on.
    """
    rewards = []
    for completion, target in zip(completions, answer, strict=True):
        if isinstance(completion, list):  # conversational format: last message content
            completion = completion[-1]["content"] if completion else ""
        text = completion.split(TOY_EOS_TOKEN, 1)[0].strip()
        rewards.append(1.0 if text == str(target).strip() else 0.0)
    return rewards


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizer and model
# ---------------------------------------------------------------------------------------------------------------------


def build_toy_tokenizer(model_max_length: int = TOY_MODEL_MAX_LENGTH):
    """Return a character-level ``transformers.PreTrainedTokenizerFast`` for the toy task.

    Every character of ``TOY_ALPHABET`` is one token; ``<pad>`` (id 0), ``<bos>`` (1), ``<eos>`` (2) and ``<unk>`` (3)
    are special tokens. No special token is added when encoding (the bos token exists for configs only), and the
    decoder concatenates tokens, so ``tokenizer.decode(tokenizer.encode(s)) == s`` for any string over the alphabet.
    Padding and truncation are on the left, as GRPO generation needs. There is no chat template: prompts are plain
    text.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate((*_SPECIAL_TOKENS, *TOY_ALPHABET))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=TOY_UNK_TOKEN))
    # One pre-token per character, whitespace included ("isolated" keeps the matched character as its own piece).
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # Without a decoder, `tokenizers` joins tokens with spaces; Fuse concatenates them as they are.
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=TOY_PAD_TOKEN,
        bos_token=TOY_BOS_TOKEN,
        eos_token=TOY_EOS_TOKEN,
        unk_token=TOY_UNK_TOKEN,
        padding_side="left",
        truncation_side="left",
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    return tokenizer


def build_toy_model(tokenizer, seed: int = 0, **overrides):
    """Return a tiny randomly initialised ``LlamaForCausalLM`` (float32, eval mode) sized to ``tokenizer``.

    Defaults: hidden size 64, 2 layers, 4 attention heads, MLP width 128, tied input/output embeddings, vocabulary,
    pad/bos/eos ids and maximum length taken from the tokenizer. Any ``LlamaConfig`` field can be overridden by
    keyword, e.g. ``tie_word_embeddings=False`` or ``num_hidden_layers=1``. The weights depend only on ``seed`` (the
    global torch RNG state is saved and restored around the initialisation). The generation config carries the
    pad/bos/eos ids so ``model.generate`` stops at ``<eos>``.

    Llama rather than Qwen2 on purpose: for a saved ``qwen2`` checkpoint, ``AutoTokenizer.from_pretrained`` swaps in
    ``Qwen2Tokenizer``, whose byte-level pipeline drops the spaces of this character-level vocabulary; for ``llama``
    it loads the saved tokenizer as it is (so ``GRPOTrainer(model=<cached path>)`` without a processing class works).
    """
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config_kwargs = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=max(tokenizer.model_max_length, 64),
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        use_cache=True,
    )
    config_kwargs.update(overrides)
    config = LlamaConfig(**config_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        max_new_tokens=8,
    )
    return model.float().eval()


# ---------------------------------------------------------------------------------------------------------------------
# Warm start, evaluation, caching
# ---------------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def torch_single_thread():
    """Context manager: run torch on one intra-op thread, restoring the previous setting afterwards.

    :func:`warm_start` and :func:`toy_success_rate` use it; wrap toy ``GRPOTrainer`` runs in it too. The toy model is
    so small that a second thread buys nothing, and on a busy machine (a CI runner, parallel test workers)
    oversubscribed OpenMP threads make each step many times slower (a 5-step toy GRPO run: about 1 s on one thread,
    over 20 s on two threads of a loaded two-core box). One thread also fixes the floating-point reduction order, so
    the warm-started weights do not depend on the caller's thread setting.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _teacher_forcing_batch(tokenizer, problems: list[tuple[str, str]]):
    """Right-padded ``input_ids``, ``attention_mask``, ``labels`` for prompt + answer + eos; labels on answer + eos."""
    rows, label_rows = [], []
    for prompt, answer in problems:
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(prompt_ids + answer_ids)
        label_rows.append([-100] * len(prompt_ids) + answer_ids)
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (row, label_row) in enumerate(zip(rows, label_rows, strict=True)):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention_mask[i, : len(row)] = 1
        labels[i, : len(row)] = torch.tensor(label_row)
    return input_ids, attention_mask, labels


def warm_start(
    model,
    tokenizer,
    steps: int = TOY_WARM_START_STEPS,
    seed: int = 0,
    lr: float = _WARM_START_LR,
    batch_size: int = _WARM_START_BATCH_SIZE,
    operators: tuple[str, ...] = TOY_OPERATORS,
) -> list[float]:
    """Fit ``model`` in place on the toy ``"train"`` split for ``steps`` supervised steps; return the per-step losses.

    A plain torch loop on one CPU thread: AdamW at ``lr`` (linear warmup over the first tenth of the steps, then
    cosine decay to zero), minibatches of ``batch_size`` problems drawn with a generator seeded by ``seed``, teacher
    forcing on ``prompt + answer + <eos>`` with the cross-entropy on the answer and eos tokens only. The default step
    count leaves the policy partly trained: at temperature 1 it solves about half of the held-out prompts, which is
    what GRPO needs for non-zero advantages. With several ``operators`` the minibatches mix their training problems
    (each operator's share of a batch is its share of the split); the policy then needs more steps per operator. The
    model's train/eval mode is restored afterwards. The default run costs about 5 s of CPU time.
    """
    input_ids, attention_mask, labels = _teacher_forcing_batch(tokenizer, toy_problems("train", operators))
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    warmup = max(1, steps // 10)

    def lr_factor(step: int) -> float:  # linear warmup over the first tenth, then cosine decay to zero
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1.0 + math.cos(math.pi * min(step - warmup, steps - warmup) / max(steps - warmup, 1)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    was_training = model.training
    model.train()
    losses = []
    with torch_single_thread():
        for _ in range(steps):
            index = torch.randint(0, input_ids.size(0), (batch_size,), generator=generator)
            batch_mask = attention_mask[index]
            width = int(batch_mask.sum(dim=1).max())  # right padding: trim the all-pad tail
            logits = model(input_ids=input_ids[index, :width], attention_mask=batch_mask[:, :width]).logits
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)).float(),
                labels[index, 1:width].reshape(-1),
                ignore_index=-100,
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
    model.train(was_training)
    return losses


@torch.no_grad()
def toy_success_rate(
    model,
    tokenizer,
    n: int = 256,
    temperature: float = 1.0,
    seed: int = 0,
    split: str = "test",
    max_new_tokens: int = 8,
    batch_size: int = 256,
    operators: tuple[str, ...] = TOY_OPERATORS,
) -> float:
    """Return the fraction of ``n`` held-out prompts that ``model`` answers correctly, sampling at ``temperature``.

    Prompts come from ``split`` (default: the held-out ``"test"`` split) of the ``operators``' problems, drawn with
    ``seed`` as in :func:`build_toy_dataset` (with replacement when ``n`` exceeds the split's size); one completion
    per prompt is sampled (greedy when ``temperature == 0``) with at most ``max_new_tokens`` new tokens, decoded
    without special tokens and scored with :func:`toy_reward`. Sampling uses ``seed`` with the global torch RNG state
    saved and restored, so the result is reproducible and leaves other code's randomness alone.
    """
    problems = _sample_problems(n, seed, split, operators)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    rewards: list[float] = []
    with torch.random.fork_rng(devices=[]), torch_single_thread():
        torch.manual_seed(seed)
        for start in range(0, len(problems), batch_size):
            chunk = problems[start : start + batch_size]
            encoded = tokenizer([p for p, _ in chunk], return_tensors="pt", padding=True, add_special_tokens=False)
            encoded = {key: value.to(device) for key, value in encoded.items()}
            sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
            output = model.generate(
                **encoded,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                **(sampling if temperature > 0 else {"do_sample": False}),
            )
            completions = tokenizer.batch_decode(output[:, encoded["input_ids"].size(1) :], skip_special_tokens=True)
            rewards.extend(toy_reward(completions, [a for _, a in chunk]))
    model.train(was_training)
    return sum(rewards) / len(rewards)


def cpu_path() -> str:
    """The ATen CPU capability the process runs its vectorised kernels with (``default``, ``avx2``, ``avx512`` ...;
    set by ``ATEN_CPU_CAPABILITY``): results that depend on bit-level numerics hold for one path only."""
    return torch.backends.cpu.get_cpu_capability().lower()


def build_toy_policy(
    seed: int = 0,
    warm_start_steps: int = TOY_WARM_START_STEPS,
    cache_dir: str | os.PathLike | None = None,
    operators: tuple[str, ...] = TOY_OPERATORS,
):
    """Return ``(model, tokenizer)``: the toy model built with ``seed``, warm-started for ``warm_start_steps`` steps
    on the ``operators``' training problems (see :func:`warm_start`).

    With ``cache_dir``, the result is saved there (``save_pretrained``, in a sub-folder named after the seed, the step
    count, the operators when they are not the default, a format version and the ATen CPU capability) the first time
    and loaded with ``from_pretrained`` afterwards, so tests and examples pay for the warm start once. The capability
    is in the name because the warm start's weights depend on the CPU kernels it ran on
    (``ATEN_CPU_CAPABILITY=default``, ``avx2`` and ``avx512`` give three different policies): a run on another numeric
    path must warm-start its own policy, not reuse one from another path. The folder is written to a
    temporary name and renamed, so concurrent callers never see a half-written policy. The model is returned in eval
    mode, in float32, on CPU.
    """
    if cache_dir is None:
        tokenizer = build_toy_tokenizer()
        model = build_toy_model(tokenizer, seed=seed)
        if warm_start_steps > 0:
            warm_start(model, tokenizer, steps=warm_start_steps, seed=seed, operators=operators)
        return model.eval(), tokenizer

    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    cache_dir = Path(cache_dir)
    operators = _check_operators(operators)
    task = "" if operators == TOY_OPERATORS else "_" + "_".join(_OPERATOR_NAMES[op] for op in operators)
    target = cache_dir / f"toy_policy_v{_CACHE_FORMAT_VERSION}_seed{seed}_steps{warm_start_steps}{task}_{cpu_path()}"
    if not (target / "config.json").exists():
        model, tokenizer = build_toy_policy(seed, warm_start_steps, cache_dir=None, operators=operators)
        cache_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=target.name + ".tmp", dir=cache_dir))
        try:
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            try:
                os.rename(staging, target)
            except OSError:  # another process won the race: its copy is equivalent
                if not (target / "config.json").exists():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    return model.eval(), tokenizer


# The toy recipe (ours, measured on the warm-started toy policy of trl_entropy.toy, seed 0): the training settings of
# `examples/train.py` without --model_name_or_path and of the entropy-collapse demo. Under it GRPO sharpens the policy
# within a few hundred steps: the reward on the training prompts rises from about 0.5 to 0.8 while the mean token
# entropy falls from about 0.5 to 0.2 nats, and the held-out success drops. What each setting is for:
# * a small, fixed pool of prompts (TOY_NUM_PROMPTS): the policy can sharpen on every one of them within the budget;
#   drawing from all 320 training problems, the reward stays flat for hundreds of steps (each problem is a separate
#   fact of a tiny model, seen a few times);
# * a warm-up: Adam's first updates are sign-like and full-size in every parameter; without a warm-up they knock the
#   warm-started policy down (reward 0.5 -> about 0.3 within 20 steps at 3e-4);
# * learning rate 3e-4, constant: at 1e-4 the policy barely moved in 300 steps, at 1e-3 the reward fell;
# * num_iterations=2: every generation batch serves two optimizer steps, so the second is off-policy and the clipping
#   that ADAPO and the clip-low recipe act on, and KL-Cov's |logp - logp_old| penalty, are not identically inactive.
TOY_TRAINING_DEFAULTS: dict = {
    "per_device_train_batch_size": 64,  # 8 prompts x 8 completions per optimizer step
    "num_generations": 8,
    "num_iterations": 2,
    "max_completion_length": 8,
    "learning_rate": 3e-4,
    "lr_scheduler_type": "constant_with_warmup",
    "warmup_steps": 20,
    "max_steps": 400,
    "logging_steps": 10,
    "save_strategy": "no",
    "report_to": [],
    "bf16": False,
    "use_cpu": True,
}
TOY_NUM_PROMPTS = 16


def toy_training_set(num_prompts: int, num_rows: int, seed: int = 0, operators: tuple[str, ...] = TOY_OPERATORS):
    """The toy training dataset: ``num_prompts`` distinct problems of the toy "train" split of the ``operators``'
    problems (addition by default; at most 320 per operator, drawn with ``seed``), repeated in order up to at least
    ``num_rows`` rows (the trainer's sampler shuffles them)."""
    available = len(toy_problems("train", operators))
    if not 1 <= num_prompts <= available:
        raise ValueError(f"num_prompts must be between 1 and {available} (the toy training split), got {num_prompts}")
    pool = build_toy_dataset(num_prompts, seed=seed, operators=operators)
    repeats = max(1, -(-num_rows // num_prompts))
    return pool.select([index for _ in range(repeats) for index in range(num_prompts)])
