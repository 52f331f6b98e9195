"""ERC, entropy ratio clipping (Su et al., "Entropy Ratio Clipping as a Soft Global Constraint for Stable
Reinforcement Learning", arXiv:2512.05591; the authors' code, Kwai-Klear/ERC at f1885c5; docs/erc.md).

* the config: the defaults, the bands refused (naming the fields) and the on-policy warning;
* the worked example of docs/erc.md number for number, as pure functions and through the trainer's loss step;
* the loss and every parameter gradient against a float64 loss written out here, for every loss type, on a real batch
  whose rollout log-probs and rollout entropies are set by construction (some tokens kept, some not, whatever the
  model would sample); the neutral band against trl.GRPOTrainer; the edge cases;
* the rollout entropy the trainer carries: the rollout policy's own, recomputed, in every layout (accumulation,
  steps_per_generation > accumulation, num_iterations > 1), never the reference model's or the current policy's;
  trainers that do not read it compute and carry nothing; a mid-cycle resume carries it exactly.

The shared suites (loss types, bad input, LoRA, trainer API, resume, accumulation, two processes, docs) cover ERC
through the registry."""

import math
import os
import re
import warnings

import pytest
import torch
from _reference.combined_reference import scores
from _reference.float64_policy import assert_step_is_float64, float64_model
from _reference.loss_types_reference import LOSS_TYPE_CASES, float64_loss
from _reference.pairs import PairMethod, PairReference
from _support.distributed_run import logged, make_rollout, make_trainer, ranked_reward
from _support.grpo import (
    SMALL_BATCH,
    build_trainer,
    lora_config,
    loss_and_gradients,
    make_grpo_batch,
    naive_entropy,
    toy_config,
    toy_trainer,
)
from _support.parity import TRL, assert_same_step
from _support.resume import CHECKPOINT, assert_resumed_equals_straight, step_values
from _support.resume import train as train_with_checkpoints
from peft import get_peft_model

from trl_entropy.core.batch import OLD_ENTROPY_KEY, CompletionBatch
from trl_entropy.core.checkpoint import GENERATION_BATCH_FILE
from trl_entropy.core.trl.objectives import LOSS_TYPES
from trl_entropy.methods import METHODS
from trl_entropy.methods.erc import ERCConfig, ERCTrainer, entropy_ratio, entropy_ratio_gate, erc_keep_mask
from trl_entropy.toy import build_toy_dataset


nan, inf = math.nan, math.inf
LOW, HIGH = 0.95, 1.05  # the authors' scripts' band, our defaults
OFF_POLICY = {"num_iterations": 2}  # ERC acts; no on-policy warning


def erc_config(**options):
    return toy_config(ERCConfig, **{**SMALL_BATCH, **OFF_POLICY, **options})


# ---------------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------------


def test_defaults_are_the_authors_scripts_band_and_the_neutral_band_is_allowed():
    config = erc_config()
    assert (config.erc_low, config.erc_high) == (LOW, HIGH)
    assert erc_config(erc_low=0.8, erc_high=1.2).erc_high == 1.2  # the authors' config default
    neutral = erc_config(erc_low=0.0, erc_high=inf)  # the neutral setting: every ratio lies in (0, inf)
    assert (neutral.erc_low, neutral.erc_high) == (0.0, inf)


BAD_VALUES = [("erc_low", value) for value in (-0.1, -1e-12, nan, inf, True, "0.9")] + [
    ("erc_high", value) for value in (0, 0.0, -1.0, nan, True, "1.1")
]


@pytest.mark.parametrize("name, value", BAD_VALUES, ids=[f"{n}={v!r}" for n, v in BAD_VALUES])
def test_bad_values_are_refused_by_name(name, value):
    with pytest.raises(ValueError, match=re.escape(f"{name}={value!r} is invalid")):
        erc_config(**{name: value})


@pytest.mark.parametrize("low, high", [(1.2, 1.1), (1.05, 1.05), (0.9, 0.5), (2.0, 2.0)])
def test_bounds_out_of_order_are_refused_naming_both(low, high):
    with pytest.raises(ValueError, match=re.escape(f"erc_low={low!r} and erc_high={high!r}")) as error:
        erc_config(erc_low=low, erc_high=high)
    assert "erc_low must be below erc_high" in str(error.value)


@pytest.mark.parametrize("low, high", [(1.0, 1.05), (1.01, 1.5), (0.5, 0.99), (0.95, 1.0), (1.5, inf)])
def test_a_band_that_leaves_out_ratio_one_is_refused_naming_both(low, high):
    """ρ = 1 (an unchanged entropy, every token of a rollout's first update) must keep its gradient."""
    with pytest.raises(ValueError, match=re.escape(f"erc_low={low!r} and erc_high={high!r}")) as error:
        erc_config(erc_low=low, erc_high=high)
    assert "erc_low < 1 < erc_high" in str(error.value)


def test_on_policy_warns_once_naming_what_makes_erc_act():
    """The config, on-policy. The other layouts, on-policy or not, for every method: tests/trainer/test_base.py (the
    same warning on each on-policy one, none off-policy)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        erc_config(num_iterations=1)
    erc = [w for w in caught if str(w.message).startswith("ERC with fully on-policy updates")]
    assert len(erc) == 1, [str(w.message) for w in caught]
    message = str(erc[0].message)
    assert "every entropy ratio is 1" in message
    assert "num_iterations > 1 or steps_per_generation > gradient_accumulation_steps for ERC to act" in message


# ---------------------------------------------------------------------------------------------------------------------
# The worked example (docs/erc.md): ε 0.2 / 0.28, token mean
# ---------------------------------------------------------------------------------------------------------------------

OLD_ENTROPY = [1.0, 0.5, 0.0, 1e-9]
ENTROPY = [1.02, 0.45, 0.0, 0.01]
ADVANTAGES = [1.0, 1.0, -1.0, -1.0]
RATIOS = [1.1, 1.0, 1.0, 0.9]
EXAMPLE_RHO = [1.02, 0.9, 1.0, 9.1e5]  # to the digits shown; (H + 1e-8) / (H^old + 1e-8) exactly below
EXAMPLE_KEEP = [True, False, True, False]
# Surrogate −min(r·A, clip(r, 0.8, 1.28)·A) = [−1.1, −1.0, 1.0, 0.9]: mean −0.05, gated or not. Gradient with respect
# to ℓ (dr/dℓ = r) of the kept tokens: −r·A/4 = −0.275 and +0.25; the gated ones: 0.
EXAMPLE_LOSS = -0.05
EXAMPLE_GRADIENT = [-0.275, 0.0, 0.25, 0.0]


def test_worked_example_ratio_and_keep_mask():
    rho = entropy_ratio(torch.tensor([ENTROPY], dtype=torch.float64), torch.tensor([OLD_ENTROPY], dtype=torch.float64))
    exact = [(h + 1e-8) / (old + 1e-8) for h, old in zip(ENTROPY, OLD_ENTROPY, strict=True)]
    torch.testing.assert_close(rho, torch.tensor([exact], dtype=torch.float64), rtol=1e-15, atol=0)
    assert rho[0].tolist() == pytest.approx(EXAMPLE_RHO, rel=2e-3)
    keep = erc_keep_mask(rho, torch.ones(1, 4), LOW, HIGH)
    assert keep.dtype == torch.bool and keep.tolist() == [EXAMPLE_KEEP]


def test_worked_example_loss_and_gradient_as_pure_functions():
    log_probs = torch.zeros(1, 4, dtype=torch.float64, requires_grad=True)
    old_log_probs = -torch.tensor([RATIOS], dtype=torch.float64).log()
    advantages = torch.tensor([ADVANTAGES], dtype=torch.float64)
    ratio = torch.exp(log_probs - old_log_probs)
    surrogate = -torch.minimum(ratio * advantages, torch.clamp(ratio, 0.8, 1.28) * advantages)
    rho = entropy_ratio(torch.tensor([ENTROPY], dtype=torch.float64), torch.tensor([OLD_ENTROPY], dtype=torch.float64))
    gated = entropy_ratio_gate(surrogate, erc_keep_mask(rho, torch.ones(1, 4), LOW, HIGH))
    torch.testing.assert_close(gated, surrogate)  # the forward value is the surrogate's
    loss = gated.mean()
    loss.backward()
    assert loss.item() == pytest.approx(EXAMPLE_LOSS, abs=1e-12)
    torch.testing.assert_close(log_probs.grad, torch.tensor([EXAMPLE_GRADIENT], dtype=torch.float64))


@pytest.fixture(scope="module")
def example_trainer(toy_model_path, toy_tokenizer, tmp_path_factory):
    return build_trainer(
        "erc",
        toy_model_path,
        toy_tokenizer,
        tmp_path_factory.mktemp("erc"),
        loss_type="bnpo",  # the token mean over the micro-batch
        epsilon=0.2,
        epsilon_high=0.28,
        **OFF_POLICY,
    )


def example_batch(advantages=ADVANTAGES):
    """The worked example as one completion of four tokens, its token advantages as given."""
    log_probs = torch.zeros(1, 4, requires_grad=True)
    batch = CompletionBatch(
        log_probs=log_probs,
        old_log_probs=-torch.tensor([RATIOS]).log(),
        entropy=torch.tensor([ENTROPY], requires_grad=True),  # differentiable, as the loss step's is
        clamped_entropy=None,
        mask=torch.ones(1, 4),
        group_advantages=torch.zeros(1, 1),
        old_entropy=torch.tensor([OLD_ENTROPY]),
    )
    return batch, torch.tensor([advantages])


def example_loss(trainer, batch, token_advantages):
    """Steps 6 (surrogate), 8 (gates, ERC's among them) and 10 (aggregation) of the trainer's loss step, and its
    metrics recorded."""
    trainer._metrics["train"].clear()
    ratio, measured = torch.exp(batch.log_probs - batch.old_log_probs), []
    per_token = trainer.surrogate(batch, ratio, token_advantages, trainer.clip_range(), measured)
    per_token = trainer.apply_gates(batch, ratio, token_advantages, per_token, {}, measured)
    trainer.record_metrics(batch.mode, measured)
    _, loss = trainer.aggregate(batch, per_token, {})
    loss.backward()
    return loss


def test_worked_example_through_the_trainer(example_trainer):
    batch, token_advantages = example_batch()
    loss = example_loss(example_trainer, batch, token_advantages)
    assert loss.item() == pytest.approx(EXAMPLE_LOSS, abs=1e-6)
    torch.testing.assert_close(batch.log_probs.grad, torch.tensor([EXAMPLE_GRADIENT]), rtol=0, atol=1e-6)
    assert batch.entropy.grad is None or torch.all(batch.entropy.grad == 0)  # ρ is detached: no entropy gradient
    assert example_trainer._metrics["train"]["erc/kept_fraction"] == [0.5]


def test_zero_advantages_give_no_loss_and_no_gradient_kept_or_not(example_trainer):
    batch, token_advantages = example_batch(advantages=[0.0, 0.0, 0.0, 0.0])
    loss = example_loss(example_trainer, batch, token_advantages)
    assert loss.item() == 0.0
    assert torch.all(batch.log_probs.grad == 0)
    assert example_trainer._metrics["train"]["erc/kept_fraction"] == [0.5]  # the gate counts every valid token


# ---------------------------------------------------------------------------------------------------------------------
# Edge cases of the gate
# ---------------------------------------------------------------------------------------------------------------------


def test_zero_entropy_under_both_policies_has_ratio_one_and_is_kept():
    zero = torch.zeros(2, 3, dtype=torch.float64)
    rho = entropy_ratio(zero, zero)
    assert torch.all(rho == 1.0)
    assert erc_keep_mask(rho, torch.ones(2, 3), LOW, HIGH).all()
    # Any entropy against itself: exactly 1 (x / x), so on-policy every token is kept.
    entropy = torch.rand(5, 7, generator=torch.Generator().manual_seed(0)) * 4
    assert torch.all(entropy_ratio(entropy, entropy.clone()) == 1.0)


def test_a_ratio_exactly_at_a_bound_is_not_kept():
    below_high, above_low = math.nextafter(HIGH, 0.0), math.nextafter(LOW, 2.0)
    rho = torch.tensor([[LOW, HIGH, above_low, below_high, 1.0, 0.5, 2.0]], dtype=torch.float64)
    keep = erc_keep_mask(rho, torch.ones_like(rho), LOW, HIGH)
    assert keep.tolist() == [[False, False, True, True, True, False, False]]
    assert erc_keep_mask(rho, torch.ones_like(rho), 0.0, inf).all()  # the neutral band keeps every finite ratio


def test_masked_tokens_are_never_kept_and_the_gate_keeps_the_forward_value():
    rho = torch.ones(2, 4)
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0]])
    assert erc_keep_mask(rho, mask, LOW, HIGH).tolist() == mask.bool().tolist()
    loss = torch.randn(2, 1, requires_grad=True)  # a sequence-level surrogate broadcasts to the token mask
    gated = entropy_ratio_gate(loss, erc_keep_mask(rho, mask, LOW, HIGH))
    assert gated.shape == (2, 4)
    torch.testing.assert_close(gated, loss.expand(2, 4))
    gated.sum().backward()
    torch.testing.assert_close(loss.grad, mask.sum(-1, keepdim=True).float())


def test_the_loss_step_uses_this_pass_entropy_on_policy_and_refuses_a_batch_missing_it(example_trainer):
    entropy = torch.rand(2, 3, requires_grad=True)
    on_policy = example_trainer.rollout_entropy({"completion_mask": torch.ones(2, 3)}, entropy)
    assert torch.equal(on_policy, entropy.detach()) and not on_policy.requires_grad
    carried = torch.rand(2, 3)
    assert example_trainer.rollout_entropy({OLD_ENTROPY_KEY: carried}, entropy) is carried
    with pytest.raises(ValueError, match=f"without it \\(no '{OLD_ENTROPY_KEY}'\\)"):
        example_trainer.rollout_entropy({"old_per_token_logps": torch.zeros(2, 3)}, entropy)


# ---------------------------------------------------------------------------------------------------------------------
# Loss and gradients on a real batch: every loss type against a float64 loss written out here
# ---------------------------------------------------------------------------------------------------------------------

# Target entropy ratios by completion position, rolled by the row: inside the band (kept) and out of it on both sides,
# every margin far above the rounding of a float32 entropy.
TARGET_RATIOS = (1.0, 0.5, 1.02, 2.0, 0.97, 1.3)
# Loss types with their options (the sequence-level ratio: a (B, 1) surrogate the gate spreads over the tokens).
LOSS_CASES = LOSS_TYPE_CASES
assert set(LOSS_CASES) == set(LOSS_TYPES)  # every loss type: ERC refuses none


def batch_with_rollout_entropy(model, tokenizer, seed, ratios=TARGET_RATIOS):
    """A real micro-batch (rollout log-probs: the model's plus noise) whose rollout entropies are set so that the
    entropy ratio to the model's float64 entropy is ``ratios`` (rolled by one position per row): which tokens the gate
    keeps is fixed by construction. Returns the inputs and the targets."""
    inputs = make_grpo_batch(model, len(tokenizer), seed=seed)
    inputs["advantages"] = torch.tensor([0.9, -0.5, 1.3, -1.6])  # no zero advantage: every row has a gradient
    entropy = naive_entropy(model, inputs)
    rows, length = entropy.shape
    targets = torch.tensor(
        [[ratios[(j + i) % len(ratios)] for j in range(length)] for i in range(rows)], dtype=torch.float64
    )
    inputs[OLD_ENTROPY_KEY] = ((entropy + 1e-8) / targets - 1e-8).float()
    return inputs, targets


def float64_erc_loss(loss_type, args, reference, inputs):
    """ERC's loss in float64 from a float64 copy of the model: the loss type's surrogate, detached where
    ρ = (H + 1e-8)/(H^old + 1e-8) leaves (L, U), plus the ungated k3 KL, then the loss type's aggregation. Returns the
    loss, the kept tokens and the entropy ratios."""
    log_probs, entropy, _ = scores(reference, inputs)
    rho = (entropy.detach() + 1e-8) / (inputs[OLD_ENTROPY_KEY].double() + 1e-8)
    keep = inputs["completion_mask"].bool() & (rho > args.erc_low) & (rho < args.erc_high)
    loss = float64_loss(
        loss_type, args, log_probs, inputs, lambda surrogate: torch.where(keep, surrogate, surrogate.detach())
    )
    return loss, keep, rho


@pytest.mark.parametrize("loss_type", LOSS_CASES)
def test_loss_and_every_gradient_equal_a_float64_erc_loss(toy_model_path, toy_tokenizer, loss_type, toy_trainer_of):
    ours = toy_trainer_of("erc", loss_type=loss_type, **OFF_POLICY, **LOSS_CASES[loss_type])
    inputs, targets = batch_with_rollout_entropy(ours.model, toy_tokenizer, seed=list(LOSS_CASES).index(loss_type))
    our_loss, our_grads = loss_and_gradients(ours, inputs)

    reference = float64_model(toy_model_path)
    loss, keep, rho = float64_erc_loss(loss_type, ours.args, reference, inputs)
    mask = inputs["completion_mask"].bool()
    # Well posed: the gate keeps the targets' tokens, no ratio near a bound, kept and gated tokens in every row.
    assert torch.equal(keep, mask & (targets > LOW) & (targets < HIGH))
    assert ((rho - LOW).abs().min() > 1e-3) and ((rho - HIGH).abs().min() > 1e-3)
    assert all(0 < keep[i].sum() < mask[i].sum() for i in range(mask.size(0)) if mask[i].sum() > 1)
    assert_step_is_float64(our_loss, our_grads, loss, reference)
    kept_fraction = (keep.double().sum() / mask.double().sum()).item()
    assert ours._metrics["train"]["erc/kept_fraction"] == [pytest.approx(kept_fraction, rel=1e-6)]

    # The comparison has power: without the gate the gradients differ (the loss does not: the gate keeps it).
    reference.zero_grad()
    ungated_inputs = dict(inputs, **{OLD_ENTROPY_KEY: naive_entropy(reference, inputs).float()})
    ungated, ungated_keep, _ = float64_erc_loss(loss_type, ours.args, reference, ungated_inputs)
    assert torch.equal(ungated_keep, mask)
    ungated.backward()
    torch.testing.assert_close(ungated.detach(), loss.detach())
    assert max((our_grads[n].double() - p.grad).abs().max().item() for n, p in reference.named_parameters()) > 1e-4


NEUTRAL_CASES = {"grpo": {"delta": 1.2, "beta": 0.04}, "dapo": {}, "cispo": {"epsilon_high": 1.2}, "sapo": {}}


@pytest.mark.parametrize("loss_type", NEUTRAL_CASES)
def test_the_neutral_band_equals_grpo_trainer_on_far_entropy_ratios(toy_tokenizer, loss_type, toy_trainer_of):
    options = {"loss_type": loss_type, **NEUTRAL_CASES[loss_type]}
    trl_trainer = toy_trainer_of(TRL, "trl", **options)
    ours = toy_trainer_of("erc", "ours", erc_low=0.0, erc_high=inf, **OFF_POLICY, **options)
    inputs, _ = batch_with_rollout_entropy(trl_trainer.model, toy_tokenizer, seed=3, ratios=(1e-6, 1e6, 0.01, 50.0))
    assert_same_step(trl_trainer, ours, inputs)
    assert ours._metrics["train"]["erc/kept_fraction"] == [1.0]


def test_the_default_band_on_an_on_policy_batch_equals_grpo_trainer(toy_tokenizer, toy_trainer_of):
    """On-policy TRL computes no rollout log-probs: the loss step takes H^old = H, ρ = 1, and keeps every token."""
    trl_trainer = toy_trainer_of(TRL, "trl", beta=0.04)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the on-policy warning, tested above
        ours = toy_trainer_of("erc", "ours", beta=0.04)
    inputs = make_grpo_batch(trl_trainer.model, len(toy_tokenizer), seed=4, old_noise=None)
    assert OLD_ENTROPY_KEY not in inputs
    assert_same_step(trl_trainer, ours, inputs)
    assert ours._metrics["train"]["erc/kept_fraction"] == [1.0]


# ---------------------------------------------------------------------------------------------------------------------
# The rollout entropy the trainer carries, in every layout
# ---------------------------------------------------------------------------------------------------------------------


class RecordingERCTrainer(ERCTrainer):
    """ERC that records the policy's weights at each generation batch (the rollout policy, LoRA adapter included)
    and, for each training micro-batch, its tokens, the rollout entropy the loss step reads and the entropy of the pass
    itself."""

    def finish_generation_batch(self, output, rows):
        self.rollout_weights.append({name: w.detach().clone() for name, w in self.model.state_dict().items()})
        return super().finish_generation_batch(output, rows)

    def completion_batch(self, inputs, scored):
        batch = super().completion_batch(inputs, scored)
        if batch.mode == "train":
            tokens = {k: inputs[k].clone() for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
            self.micro_batches.append(
                dict(
                    rollout=len(self.rollout_weights) - 1,
                    tokens=tokens,
                    carried=OLD_ENTROPY_KEY in inputs,
                    old_entropy=batch.old_entropy.clone(),
                    entropy=scored.entropy.detach().clone(),
                )
            )
        return batch


LAYOUTS = {  # (options, whether TRL computes rollout log-probs), eight completions per optimizer step
    # A LoRA adapter: TRL scores the reference with the adapter switched off, through the same module as the policy.
    "lora": (dict(per_device_train_batch_size=8, num_iterations=2, peft=True), True),
    "accumulation": (dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_iterations=1), False),
    "steps_per_generation": (dict(per_device_train_batch_size=4, steps_per_generation=2, num_iterations=1), True),
    "num_iterations": (dict(per_device_train_batch_size=8, num_iterations=2), True),
    "all_three": (
        dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=4, num_iterations=2),
        True,
    ),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_carried_rollout_entropy_is_the_rollout_policys_in_every_layout(layout, warm_toy_policy_path, tmp_path):
    """Each micro-batch's H^old, recomputed in float64 by the policy as it was when the batch was generated, matches
    at every valid token: the right pass (not the reference model's: beta > 0, and the policy has moved from it by the
    second generation), the right rows after TRL's shuffle and split, and kept across the cycle's later updates."""
    options, off_policy = LAYOUTS[layout]
    options = dict(options)
    peft_config = lora_config() if options.pop("peft", False) else None
    generate_every = options.get("steps_per_generation", options.get("gradient_accumulation_steps", 1))
    generate_every *= options["num_iterations"]
    steps = 2 * generate_every // options.get("gradient_accumulation_steps", 1) + 1  # three generation batches
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the accumulation layout is on-policy: ERC warns, as tested above
        args = toy_config(
            ERCConfig,
            tmp_path,
            num_generations=4,
            max_completion_length=8,
            learning_rate=1e-2,
            max_steps=steps,
            beta=0.04,
            save_strategy="no",
            logging_steps=1,
            seed=0,
            **options,
        )
        trainer = toy_trainer(
            RecordingERCTrainer,
            args,
            warm_toy_policy_path,
            reward_funcs=ranked_reward,
            train_dataset=build_toy_dataset(64, seed=0),
            rollout_func=make_rollout(),
            peft_config=peft_config,
        )
    trainer.rollout_weights, trainer.micro_batches = [], []
    trainer.train()
    assert len(trainer.rollout_weights) == 3
    assert len(trainer.micro_batches) == steps * options.get("gradient_accumulation_steps", 1)

    reference = float64_model(warm_toy_policy_path)  # LoRA: the base model
    policy = float64_model(warm_toy_policy_path)
    if peft_config is not None:
        policy = get_peft_model(policy, lora_config())
    moved_from_rollout = moved_from_reference = 0.0
    for record in trainer.micro_batches:
        assert record["carried"] == off_policy
        policy.load_state_dict({name: w.double() for name, w in trainer.rollout_weights[record["rollout"]].items()})
        rollout_entropy = naive_entropy(policy, record["tokens"])
        mask = record["tokens"]["completion_mask"].bool()
        old_entropy = record["old_entropy"].double()
        torch.testing.assert_close(old_entropy[mask], rollout_entropy[mask], rtol=1e-5, atol=1e-5)
        if not off_policy:  # on-policy the loss step takes this pass's entropy itself
            assert torch.equal(record["old_entropy"], record["entropy"])
        moved_from_rollout = max(moved_from_rollout, (record["entropy"].double() - old_entropy)[mask].abs().max())
        if record["rollout"] > 0:
            reference_entropy = naive_entropy(reference, record["tokens"])
            moved_from_reference = max(moved_from_reference, (reference_entropy - old_entropy)[mask].abs().max())
    # The check has power: the reference model's entropy, and in the off-policy layouts the current policy's, are far
    # from the rollout policy's.
    assert moved_from_reference > 1e-2
    if off_policy:
        assert moved_from_rollout > 1e-2
    assert any(value < 1 for value in logged(trainer, "erc/kept_fraction")) == off_policy


def test_trainers_that_do_not_read_the_rollout_entropy_carry_none(warm_toy_policy_path, tmp_path, monkeypatch):
    readers = [
        name for name, spec in METHODS.items() if any(p.needs_rollout_entropy for p in spec.config_class.method_parts)
    ]
    assert "erc" in readers and "grpo" not in readers
    calls = []
    trainer = make_trainer("grpo", warm_toy_policy_path, str(tmp_path), num_iterations=2, max_steps=2, beta=0.04)
    assert not trainer.needs_rollout_entropy
    scored = type(trainer).score_tokens

    def counting(self, *args, **kwargs):
        calls.append(self._scoring_calls)
        return scored(self, *args, **kwargs)

    monkeypatch.setattr(type(trainer), "score_tokens", counting)
    trainer.train()
    assert calls and all(recorded is None for recorded in calls)  # nothing recorded while generating
    assert all(OLD_ENTROPY_KEY not in batch for batch in trainer.buffered_generation_batch)
    assert "old_per_token_logps" in trainer.buffered_generation_batch[0]  # off-policy: TRL's own are there


def test_erc_keeps_the_rollout_entropy_from_the_rollout_log_prob_pass_only(warm_toy_policy_path, tmp_path):
    """One forward pass per scoring call TRL makes: the rollout entropy costs no extra pass."""
    trainer = make_trainer("erc", warm_toy_policy_path, str(tmp_path), max_steps=1, beta=0.04)
    base = make_trainer("grpo", warm_toy_policy_path, str(tmp_path / "base"), max_steps=1, beta=0.04, num_iterations=2)
    counts = []
    for run in (trainer, base):
        count = [0]
        run.model.register_forward_hook(lambda *_, count=count: count.__setitem__(0, count[0] + 1))
        run.train()
        counts.append(count[0])
    assert counts[0] == counts[1] > 0
    assert OLD_ENTROPY_KEY in trainer.buffered_generation_batch[0]


# ---------------------------------------------------------------------------------------------------------------------
# Resume in the middle of a generation cycle
# ---------------------------------------------------------------------------------------------------------------------


def test_a_mid_cycle_resume_carries_the_rollout_entropy_exactly(warm_toy_policy_path, tmp_path):
    """The checkpoint of step 1 (the cycle's second update still to come) holds each micro-batch's rollout entropy;
    resumed from it, the run equals the straight one. The same checkpoint with the entropies changed trains
    differently, and without them is refused."""
    straight, values = train_with_checkpoints("erc", warm_toy_policy_path, str(tmp_path / "straight"))
    assert step_values(straight, "erc/kept_fraction")[CHECKPOINT + 1] < 1  # the gate acts on the resumed update
    checkpoint = tmp_path / "straight" / f"checkpoint-{CHECKPOINT}"
    path = checkpoint / GENERATION_BATCH_FILE.format(process_index=0)
    saved = torch.load(path, weights_only=True)
    for micro_batch in saved:
        assert micro_batch[OLD_ENTROPY_KEY].shape == micro_batch["old_per_token_logps"].shape
    resumed, resumed_values = train_with_checkpoints(
        "erc", warm_toy_policy_path, str(tmp_path / "resumed"), resume_from=str(checkpoint)
    )
    assert_resumed_equals_straight(straight, values, resumed, resumed_values)

    torch.save([dict(b, **{OLD_ENTROPY_KEY: b[OLD_ENTROPY_KEY] * 1.1}) for b in saved], path)
    changed, changed_values = train_with_checkpoints(
        "erc", warm_toy_policy_path, str(tmp_path / "changed"), resume_from=str(checkpoint)
    )
    with pytest.raises(AssertionError):
        assert_resumed_equals_straight(straight, values, changed, changed_values)
    torch.save([{k: v for k, v in b.items() if k != OLD_ENTROPY_KEY} for b in saved], path)
    with pytest.raises(ValueError, match=f"no '{OLD_ENTROPY_KEY}'"):
        train_with_checkpoints("erc", warm_toy_policy_path, str(tmp_path / "missing"), resume_from=str(checkpoint))
    assert os.path.exists(path)


# The pair table's piece (tests/compose/test_pairs.py): its gate.


def pair_erc_gate(per_token_loss, log_probs, old_log_probs, entropy, old_entropy, advantages, mask, s):
    """ERC (arXiv:2512.05591) detaches the loss where the entropy ratio ``(H + 1e-8) / (H^old + 1e-8)`` leaves
    ``(L, U)``."""
    rho = (entropy.detach() + 1e-8) / (old_entropy + 1e-8)
    keep = (rho > s["erc_low"]) & (rho < s["erc_high"])
    return torch.where(keep, per_token_loss, per_token_loss.detach())


PAIR = PairReference(
    settings=dict(erc_low=0.95, erc_high=1.05),
    methods={"erc": PairMethod("stop-gradient gates", gate=pair_erc_gate)},
)
