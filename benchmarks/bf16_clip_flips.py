"""How often bf16 scoring flips PPO's clip decision, and how much it biases the importance ratio, on real batches of
SmolLM2-135M-Instruct (Petrenko et al., "Entropy-Preserving Reinforcement Learning", arXiv:2603.11682, §4.1, Thm. 3
and App. B.1). The numbers and the setup are in benchmarks/results/real_model_numerics.md.

The trainers of this project score with the fp32 kernel (``trl_entropy.kernels.chunked_logprob_entropy``), whatever
the model's dtype; a bf16 stack scores differently. This script measures the difference on completions the model
samples itself on the chat arithmetic task (``chat_batches.py``). For each batch:

1. the rollout policy θ0 (the checkpoint) samples the batch; its rewards give TRL's group advantages;
2. θ0 scores it in fp32 (the kernel on the fp32 model's hidden states: the reference) and in bf16 (the model cast to
   bf16, its bf16 logits, an fp32 log-softmax: TRL 1.16's fused head on a bf16 model);
3. for each of ``--learning-rates`` (TRL's default 1e-6, and 1e-5 for a policy that moved further), θ1 is θ0 after
   the first step of a fresh AdamW (TRL's other defaults: no weight decay, gradient norm clipped to 1) on the batch's
   policy-gradient loss (the clipped surrogate's gradient at ratio 1), and scores the batch both ways again;
4. θ0 comes back for the next batch, so every batch is an independent sample of the same policy.

Each scoring is compared with the fp32 reference in three variants: the fp32 log-probs rounded to bf16 (the paper's
§4.1 cast of the model's outputs, alone), the bf16 model, and the bf16 model with its log-probs rounded to bf16 (the
cast FSDP2 applies to a bf16 model's outputs by default, App. B.1). In two setups:

* ``step, lr …``: the ratio of θ1 to θ0, both scored by the variant, against both scored in fp32 (the PPO ratio of
  the second pass over a batch, TRL's ``num_iterations=2``);
* ``mismatch``: θ0 scored by the variant against θ0 scored in fp32 (a bf16 trainer's ratio to an fp32 rollout's
  log-probs; in fp32 that ratio is exactly 1).

For every clipped loss type of TRL 1.16 (``PPO_CLIP_LOSS_TYPES``) with its importance-sampling level and clip range
(``SETTINGS``), the table counts the valid tokens whose clip decision
(``trl_entropy.core.trl.surrogates.ppo_clip_active``) the variant changes, into the clip and out of it, the share of
the loss type's token weight they carry, and the ratio's bias: the mean of ``r / r_fp32 - 1`` over the valid tokens
and the mean and spread of ``log(r / r_fp32)``.

It needs a second scoring pass of the whole model per policy, so it is a separate command, not a training metric.

    python benchmarks/bf16_clip_flips.py --batches 8 --learning-rates 1e-6,1e-5
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass

import torch
from chat_batches import load_policy, sample_chat_batch, score_fp32

from trl_entropy.core.trl.objectives import aggregate_loss
from trl_entropy.core.trl.surrogates import importance_ratio, ppo_clip_active


@dataclass(frozen=True)
class ClipSetting:
    """A clipped loss type as TRL 1.16 runs it: its aggregation, importance-sampling level and clip range."""

    label: str
    loss_type: str
    level: str
    epsilon_low: float
    epsilon_high: float


# TRL's defaults (ε = 0.2 on both sides, token ratios) for each loss type; LUSPO with the sequence ratio TRL requires
# of it; DAPO also with its paper's clip-higher ε_high = 0.28, the setting of Petrenko et al.'s Fig. 2(a).
SETTINGS = (
    ClipSetting("grpo", "grpo", "token", 0.2, 0.2),
    ClipSetting("bnpo", "bnpo", "token", 0.2, 0.2),
    ClipSetting("dr_grpo", "dr_grpo", "token", 0.2, 0.2),
    ClipSetting("dapo", "dapo", "token", 0.2, 0.2),
    ClipSetting("dapo, ε_high 0.28", "dapo", "token", 0.2, 0.28),
    ClipSetting("luspo (sequence ratio)", "luspo", "sequence", 0.2, 0.2),
)


def round_to_bf16(log_probs: torch.Tensor) -> torch.Tensor:
    """``log_probs`` rounded to bf16 (round to nearest even, as a cast does) and back to fp32, where the ratio is
    taken: the cast of §4.1 alone."""
    return log_probs.to(torch.bfloat16).float()


def compare_clip_decisions(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    reference_log_probs: torch.Tensor,
    reference_old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    setting: ClipSetting,
) -> dict[str, float]:
    """The clip decisions of the ratio ``exp(log_probs - old_log_probs)`` against those of the reference ratio, on
    the valid tokens of one batch, ``(B, T)`` tensors and ``(B,)`` advantages.

    Returns sums, which add across batches: ``tokens``; ``reference_clipped`` and ``clipped``, the tokens each ratio
    puts in the clip's flat region; ``into_clip`` and ``out_of_clip``, the tokens only the ratio, or only the
    reference, clips; ``flipped_weight`` and ``weight``, the loss type's aggregation weights of the flipped tokens
    and of all of them (the batch taken as one micro-batch); ``quotient`` and ``quotient_sq``, the sums of
    ``q = r / r_reference`` and of ``q**2``; ``log_quotient`` and ``log_quotient_sq``, those of ``log q``. At the
    sequence level every token carries its sequence's ratio and decision.
    """
    mask = mask.bool()
    advantages = advantages.unsqueeze(1)
    ratio = importance_ratio(log_probs.double(), old_log_probs.double(), mask, setting.level)
    reference = importance_ratio(reference_log_probs.double(), reference_old_log_probs.double(), mask, setting.level)

    def clipped(r: torch.Tensor) -> torch.Tensor:
        active = ppo_clip_active(r, advantages, setting.epsilon_low, setting.epsilon_high)
        return active.expand_as(mask) & mask

    ours, theirs = clipped(ratio), clipped(reference)
    log_quotient = (ratio.log() - reference.log()).expand_as(mask)[mask]

    def weight(tokens: torch.Tensor) -> float:
        # aggregate_loss of an indicator is the weight the loss type gives those tokens; DAPO's normaliser is the
        # batch's own token count, as for one micro-batch alone.
        total, _ = aggregate_loss(tokens.double(), mask, setting.loss_type, mask.size(1), mask.sum().double())
        return float(total)

    return {
        "tokens": int(mask.sum()),
        "reference_clipped": int(theirs.sum()),
        "clipped": int(ours.sum()),
        "into_clip": int((ours & ~theirs).sum()),
        "out_of_clip": int((theirs & ~ours).sum()),
        "flipped_weight": weight(ours != theirs),
        "weight": weight(mask),
        "quotient": float(log_quotient.exp().sum()),
        "quotient_sq": float(log_quotient.exp().square().sum()),
        "log_quotient": float(log_quotient.sum()),
        "log_quotient_sq": float(log_quotient.square().sum()),
    }


def add_sums(total: dict[str, float], sums: dict[str, float]) -> dict[str, float]:
    return {key: total.get(key, 0) + value for key, value in sums.items()}


def wilson_interval(count: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion ``count / n``: finite and inside [0, 1] even at 0 counts."""
    if n == 0:
        return 0.0, 1.0
    p = count / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def table_row(setup: str, variant: str, label: str, sums: dict[str, float]) -> str:
    """One row of the printed table, percentages of the valid tokens."""
    n = sums["tokens"]
    flipped = int(sums["into_clip"] + sums["out_of_clip"])
    low, high = wilson_interval(flipped, n)
    mean_q = sums["quotient"] / n
    stderr_q = math.sqrt(max(sums["quotient_sq"] / n - mean_q**2, 0.0) / n)
    mean_log = sums["log_quotient"] / n
    std_log = math.sqrt(max(sums["log_quotient_sq"] / n - mean_log**2, 0.0))
    return (
        f"| {setup} | {variant} | {label} | {n} | {100 * sums['reference_clipped'] / n:.3f} | "
        f"{100 * sums['clipped'] / n:.3f} | {flipped} ({int(sums['into_clip'])} in, {int(sums['out_of_clip'])} out) "
        f"| {100 * flipped / n:.3f} [{100 * low:.3f}, {100 * high:.3f}] | "
        f"{100 * sums['flipped_weight'] / sums['weight']:.3f} | {mean_q - 1:+.2e} ± {stderr_q:.1e} | "
        f"{mean_log:+.2e} | {std_log:.2e} |"
    )


def score_bf16(model_bf16, batch) -> torch.Tensor:
    """Per-token log-probs ``(B, T)`` of the completion from a bf16 model: its bf16 logits at the completion
    positions, then an fp32 log-softmax, as TRL 1.16's fused head computes them for a bf16 model (bf16 logit tiles,
    fp32 reductions)."""
    targets = batch["completion_ids"]
    with torch.no_grad():
        logits = model_bf16(
            input_ids=torch.cat([batch["prompt_ids"], targets], dim=1),
            attention_mask=torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1),
            logits_to_keep=targets.size(1) + 1,
        ).logits[:, :-1]
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


# The variants: from a policy's two scorings (fp32 reference, bf16 model), the log-probs the variant's ratio takes.
VARIANTS = {
    "fp32 model, bf16 outputs": lambda scores: round_to_bf16(scores["fp32"]),
    "bf16 model": lambda scores: scores["bf16"],
    "bf16 model, bf16 outputs": lambda scores: round_to_bf16(scores["bf16"]),
}


def score_both(model, model_bf16, batch) -> dict[str, torch.Tensor]:
    """The fp32 reference and the bf16 scoring of the model's current weights."""
    model_bf16.load_state_dict(model.state_dict())  # copies, casting each weight to bf16
    with torch.no_grad():
        reference, _ = score_fp32(model, batch)
    return {"fp32": reference, "bf16": score_bf16(model_bf16, batch)}


def clipped_policy_gradient(model, batch) -> None:
    """Leave in ``.grad`` the gradient of the batch's policy-gradient loss at the model's weights (TRL's default
    token-mean aggregation; at ratio 1 the clipped surrogate's gradient is this one), its norm clipped to 1
    (transformers.Trainer's ``max_grad_norm``)."""
    model.zero_grad(set_to_none=True)
    log_probs, _ = score_fp32(model, batch)
    mask = batch["completion_mask"]
    loss = -(batch["advantages"].unsqueeze(1) * log_probs * mask).sum() / mask.sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)


def measure_batch(model, model_bf16, batch, learning_rates) -> dict[tuple[str, str, str], dict[str, float]]:
    """Every (setup, variant, setting)'s sums for one batch: a ``step`` setup per learning rate (θ1: one AdamW step
    from θ0, TRL's defaults but the rate) and the ``mismatch`` setup. The model is back at θ0 afterwards."""
    before = score_both(model, model_bf16, batch)
    clipped_policy_gradient(model, batch)
    theta0 = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    after = {}
    for learning_rate in learning_rates:
        torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0).step()  # a fresh one: its first step
        after[learning_rate] = score_both(model, model_bf16, batch)
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                parameter.copy_(theta0[name])
    model.zero_grad(set_to_none=True)
    advantages, mask = batch["advantages"], batch["completion_mask"]
    sums = {}
    for variant, log_probs_of in VARIANTS.items():
        ratios = {
            f"step, lr {rate:g}": (log_probs_of(scores), log_probs_of(before), scores["fp32"], before["fp32"])
            for rate, scores in after.items()
        }
        ratios["mismatch"] = (log_probs_of(before), before["fp32"], before["fp32"], before["fp32"])
        for setup, log_probs in ratios.items():
            for setting in SETTINGS:
                sums[setup, variant, setting.label] = compare_clip_decisions(*log_probs, advantages, mask, setting)
    return sums


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a checkpoint folder (default: fetch smollm2-135m-instruct)")
    parser.add_argument("--cache-dir", default=None, help="fetch_model's cache (default: its own)")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per batch")
    parser.add_argument("--generations", type=int, default=8, help="completions per prompt (one group)")
    parser.add_argument("--completion", type=int, default=32, help="most completion tokens")
    parser.add_argument("--digits", type=int, default=1, help="operand digits of the chat arithmetic task")
    parser.add_argument(
        "--learning-rates", default="1e-6,1e-5", help="comma-separated: one step setup each (1e-6 is TRL's default)"
    )
    parser.add_argument("--seed", type=int, default=0, help="batch b is drawn and sampled with seed + b")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    learning_rates = [float(rate) for rate in args.learning_rates.split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model is None:
        from trl_entropy.pretrained import fetch_model

        args.model = fetch_model("smollm2-135m-instruct", cache_dir=args.cache_dir)
    model, tokenizer = load_policy(args.model)
    model_bf16, _ = load_policy(args.model, dtype=torch.bfloat16)
    print(
        f"model={args.model} batches={args.batches} batch={args.prompts}x{args.generations} completion<="
        f"{args.completion} digits={args.digits} learning_rates={learning_rates} seed={args.seed} "
        f"threads={torch.get_num_threads()}",
        flush=True,
    )
    totals: dict[tuple[str, str, str], dict[str, float]] = {}
    for index in range(args.batches):
        start = time.perf_counter()
        batch = sample_chat_batch(
            model, tokenizer, args.prompts, args.generations, args.completion, args.seed + index, args.digits
        )
        for key, sums in measure_batch(model, model_bf16, batch, learning_rates).items():
            totals[key] = add_sums(totals.get(key, {}), sums)
        print(
            f"batch {index}: {int(batch['completion_mask'].sum())} tokens, mean reward "
            f"{batch['rewards'].mean():.3f}, {int((batch['advantages'] != 0).sum())} completions with an advantage, "
            f"{time.perf_counter() - start:.0f} s",
            flush=True,
        )
    print(
        "| setup | variant | loss type | tokens | clipped fp32 % | clipped variant % | flipped | flipped % [95 %] "
        "| flipped % of loss weight | mean r/r_fp32 − 1 | mean log(r/r_fp32) | std log(r/r_fp32) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    for (setup, variant, label), sums in totals.items():
        print(table_row(setup, variant, label, sums), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
