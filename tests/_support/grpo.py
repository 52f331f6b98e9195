"""What the tests share besides fixtures: hand-built GRPO micro-batches, the one config builder (:func:`toy_config`)
and the one trainer builder (:func:`toy_trainer`) that every other builder of the tests goes through, the loss and
gradients of one step, and float64 log-probs and entropies from the full logits."""

import functools
import os

import torch
from _reference.float64_policy import completion_log_softmax, entropy_of


# The warm start is deterministic, so its result is cached across test sessions (keyed by the toy's format version).
TOY_CACHE = os.environ.get(
    "TRL_ENTROPY_TEST_CACHE", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".toy_cache")
)


def make_grpo_batch(model, vocab_size, *, batch=4, prompt_len=5, completion_len=6, seed=0, old_noise=0.3, ref=True):
    """A GRPO micro-batch as ``_generate_and_score_completions`` returns it, with padding on both sides.

    The rollout and reference log-probs are the model's own (computed here from the full logits) plus noise, so the
    ratios fall on both sides of the clip range. With rollout log-probs comes the rollout entropy (``old_entropy``,
    what a trainer that reads it finds there): the model's own, without noise (no random draw: the rest of the batch
    is as it was).
    """
    from trl_entropy.core.batch import OLD_ENTROPY_KEY

    generator = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(4, vocab_size, (batch, prompt_len), generator=generator)
    prompt_mask = torch.ones(batch, prompt_len, dtype=torch.long)
    prompt_mask[0, :2] = 0  # left padding
    completion_ids = torch.randint(4, vocab_size, (batch, completion_len), generator=generator)
    completion_mask = torch.ones(batch, completion_len, dtype=torch.long)
    completion_mask[1:2, 3:] = 0  # an early eos (rows that exist)
    completion_mask[2:3, 1:] = 0
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.randn(batch, generator=generator),
        "num_items_in_batch": completion_mask.sum(),
    }
    log_softmax = naive_log_softmax(model, inputs)
    log_probs = log_softmax.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1).float()
    entropy = entropy_of(log_softmax).float()
    if old_noise is not None:
        inputs["old_per_token_logps"] = log_probs + old_noise * torch.randn(log_probs.shape, generator=generator)
        inputs[OLD_ENTROPY_KEY] = entropy
    if ref:
        inputs["ref_per_token_logps"] = log_probs + 0.2 * torch.randn(log_probs.shape, generator=generator)
    return inputs


# ---------------------------------------------------------------------------------------------------------------------
# Helpers shared by the method tests
# ---------------------------------------------------------------------------------------------------------------------


def toy_config(config_class, output_dir="unused", **options):
    """The one config builder of the tests: ``config_class`` on the CPU in fp32, logging nowhere, plus ``options``."""
    return config_class(**{"output_dir": str(output_dir), "report_to": [], "use_cpu": True, "bf16": False, **options})


# The command line of a one-step toy run (`trl-entropy train`, examples/train.py). Seed 0 trains from the seed-0 toy
# policy, the one the suite's cache (`TOY_CACHE`) already holds.
ONE_STEP_RUN = ["--max_steps", "1", "--per_device_train_batch_size", "8", "--num_generations", "4"]
ONE_STEP_RUN += ["--logging_steps", "1", "--seed", "0"]

# The micro-batch of the hand-driven loss-step tests: 4 completions of one prompt, at most 6 tokens.
SMALL_BATCH = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=6)


@functools.cache
def toy_dataset(size: int, seed: int = 0):
    """``build_toy_dataset(size, seed=seed)``, built once per test process: a pure function of its arguments, which
    trainers only read (an Arrow dataset cannot be changed in place)."""
    from trl_entropy.toy import build_toy_dataset

    return build_toy_dataset(size, seed=seed)


def toy_trainer(
    trainer_class,
    args,
    model,
    processing_class=None,
    reward_funcs=None,
    train_dataset=None,
    accumulation=None,
    **keyword,
):
    """The one trainer builder of the tests: ``trainer_class`` on ``model`` (a path or a model) with ``args`` (built by
    :func:`toy_config`, or as a test needs it), the toy reward and the toy task's first 8 problems unless given;
    ``keyword`` goes to the trainer as it is (``eval_dataset``, ``rollout_func``, ``peft_config``...).

    ``accumulation``: for a test that calls ``compute_loss`` itself, the micro-batches of each optimizer step it drives
    (the trainer goes to train mode and expects that many; ``args`` holds the config's own count)."""
    from trl_entropy.toy import toy_reward

    trainer = trainer_class(
        model=model,
        reward_funcs=toy_reward if reward_funcs is None else reward_funcs,
        args=args,
        train_dataset=toy_dataset(8) if train_dataset is None else train_dataset,
        processing_class=processing_class,
        **keyword,
    )
    if accumulation is not None:
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = accumulation
    return trainer


def method_classes(method):
    """``(trainer_class, config_class)`` of ``method``: a registry name or a ``NAME+NAME`` combination
    (:func:`trl_entropy.methods.get_method`), or that pair itself where a test needs classes of its own (TRL's, a
    mismatch)."""
    if not isinstance(method, str):
        return method
    from trl_entropy.methods import get_method

    spec = get_method(method)
    return spec.trainer_class, spec.config_class


def build_trainer(
    method, path, tokenizer, output_dir, accumulation=1, train_dataset=None, reward_funcs=None, **options
):
    """The trainer of ``method`` (:func:`method_classes`) on the model at ``path``, whose ``compute_loss`` the test
    drives by hand: fp32, CPU, train mode, the small micro-batch, ``accumulation`` micro-batches per optimizer step and
    per generation, then ``options``."""
    trainer_class, config_class = method_classes(method)
    options = {**SMALL_BATCH, "gradient_accumulation_steps": accumulation, **options}
    args = toy_config(config_class, output_dir, **options)
    trainer = toy_trainer(trainer_class, args, path, tokenizer, reward_funcs, train_dataset, accumulation=accumulation)
    # accelerate's gradient state is shared by every trainer of the process: start from the state a training step
    # starts from (the last micro-batch of a window), whatever an earlier test left.
    set_sync(trainer, True)
    return trainer


def set_sync(trainer, sync):
    """Mark the next micro-batch as the last of its accumulation window (True) or not."""
    trainer.accelerator.gradient_state._set_sync_gradients(sync)


def loss_and_gradients(trainer, inputs):
    """The loss of one ``compute_loss`` call and every parameter's gradient."""
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, dict(inputs))
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.grad is not None}


def naive_log_softmax(model, inputs):
    """Log-softmax of the full logits at the completion positions, in float64 (temperature 1), without gradient."""
    with torch.no_grad():
        return completion_log_softmax(model, inputs)


def naive_log_probs(model, inputs):
    """Per-token log-probs of the sampled completion tokens, from the full logits in float64, without gradient."""
    return naive_log_softmax(model, inputs).gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)


def naive_entropy(model, inputs):
    """Per-token full entropy of the completion, from the full logits in float64, without gradient."""
    return entropy_of(naive_log_softmax(model, inputs))


def split_batch(inputs):
    """Two half micro-batches of a GRPO micro-batch (rows 0..B/2 and B/2..B)."""
    half = inputs["prompt_ids"].size(0) // 2
    halves = []
    for rows in (slice(0, half), slice(half, None)):
        part = {k: (v[rows] if torch.is_tensor(v) and v.dim() > 0 else v) for k, v in inputs.items()}
        part["num_items_in_batch"] = inputs["num_items_in_batch"]
        halves.append(part)
    return halves


def varied_batch(model, vocab_size, seed):
    """A batch of 8 whose halves hold different numbers of valid tokens (so a mean of means would differ)."""
    inputs = make_grpo_batch(model, vocab_size, batch=8, seed=seed)
    inputs["completion_mask"][4 + seed % 4, 2:] = 0
    inputs["completion_mask"][5, 1:] = 0
    inputs["num_items_in_batch"] = inputs["completion_mask"].sum()
    return inputs


def full_logit_log_probs(model, input_ids, attention_mask, completion_length):
    """Log-probs of the last ``completion_length`` tokens from the full logits, in float64 (no kernel)."""
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.double()
    log_probs = torch.log_softmax(logits[:, -completion_length - 1 : -1], -1)
    return log_probs.gather(-1, input_ids[:, -completion_length:].unsqueeze(-1)).squeeze(-1)


def lora_config():
    """The tests' LoRA adapter on the toy model's attention."""
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def on_policy_warnings(method, path, tokenizer, output_dir, accumulation=1, **options):
    """The on-policy warnings (their messages) that building a trainer and two of its loss steps raise: a method that
    acts only off-policy warns once, at construction."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = build_trainer(method, path, tokenizer, output_dir, accumulation, **options)
        for seed in range(2):  # training steps add no warning
            trainer.compute_loss(trainer.model, make_grpo_batch(trainer.model, len(tokenizer), seed=seed))
    return [str(w.message) for w in caught if "on-policy" in str(w.message)]
