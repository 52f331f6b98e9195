"""The warm start: a short supervised fit that leaves the toy policy succeeding some of the time, and its cache."""

import contextlib
import math
import os
from pathlib import Path

import torch

from .._folder_cache import build_folder_once
from .model import build_toy_model, build_toy_tokenizer
from .task import _OPERATOR_NAMES, TOY_OPERATORS, _check_operators, toy_problems


TOY_WARM_START_STEPS = 300
_WARM_START_LR = 3e-3
_WARM_START_BATCH_SIZE = 64
_CACHE_FORMAT_VERSION = 1  # bump whenever the tokenizer, model, task or warm start changes


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
    temporary name and renamed, so concurrent callers never see a half-written policy, and the warm start holds a lock
    file beside it, so concurrent callers wait for the first one's policy instead of each warm-starting it (POSIX).
    The model is returned in eval mode, in float32, on CPU.
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
    build_folder_once(target, lambda staging: _warm_start_into(staging, seed, warm_start_steps, operators))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    return model.eval(), tokenizer


def _warm_start_into(folder: Path, seed: int, warm_start_steps: int, operators: tuple[str, ...]) -> None:
    """Warm-start the policy and save it (model and tokenizer) into ``folder``."""
    model, tokenizer = build_toy_policy(seed, warm_start_steps, cache_dir=None, operators=operators)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
