"""Entrocraft, entropy-scheduled rejection of rollouts (Li et al., arXiv:2604.26326; the authors' code,
lblaoke/entrocraft at 26165bd; docs/entrocraft.md).

* the worked example of docs/entrocraft.md number for number: the band at u = 50/100, the three branches of the
  authors' switch and the two of the sign form, their losses and gradients, as pure functions against the float64
  formulas written out here, and through the trainer's generation tail and loss step;
* the band's shapes on the authors' clock ``u = (k + 1)/K``, and the trainer's cycle count ``(k, K)``;
* the rollout entropy: kept from TRL's rollout pass off-policy, one pass without gradient on-policy (against the
  float64 entropy of the full logits), or the previous cycle's training entropy, measured and carried;
* the config: its refusals naming the fields, and the warning when rewards never go below the offset (its axes and
  its warning beside another entropy controller: tests/compose/test_pairs.py).

The shared suites (the neutral setting against trl.GRPOTrainer, bad input, resume, two processes, combinations and
their float64 reference, docs) cover Entrocraft through the registry."""

import math
import warnings

import pytest
import torch
from _reference.combined_reference import scores
from _reference.float64_policy import assert_step_is_float64, float64_model
from _reference.loss_types_reference import LOSS_TYPE_CASES, float64_loss
from _reference.pairs import PairMethod, PairReference
from _support.grpo import (
    SMALL_BATCH,
    loss_and_gradients,
    make_grpo_batch,
    naive_entropy,
    set_sync,
    toy_config,
    toy_trainer,
)

from trl_entropy.core.batch import OLD_ENTROPY_KEY, CompletionBatch
from trl_entropy.core.trainer import LossStep
from trl_entropy.core.trl.objectives import LOSS_TYPES
from trl_entropy.methods.entrocraft import (
    ABOVE,
    BELOW,
    INSIDE,
    EntrocraftConfig,
    EntrocraftTrainer,
    entrocraft_advantages,
    entrocraft_band,
    entrocraft_branch,
)


# The worked example: one group of two, rewards +1 and −1; clip 0.2/0.2; the token mean over 5 valid tokens.
REWARDS = [1.0, -1.0]
PROBABILITIES = [[0.5, 0.6, 0.9], [0.3, 0.2, 0.5]]
OLD_PROBABILITIES = [[0.45, 0.6, 0.95], [0.4, 0.2, 0.5]]
OLD_ENTROPY = [[0.5, 0.9, 0.3], [0.8, 0.75, 0.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
GRPO_ADVANTAGE = 0.70706  # TRL's: (±1 − 0) / (std + 1e-4), std = √2
# Branch -> (advantages, loss, ∂L/∂ℓ) of the authors' switch, at the entropy that selects it.
EXAMPLE = {
    ABOVE: (0.65, [1.0, 0.0], -0.6117, [[-0.2222, -0.2000, -0.1895], [0.0, 0.0, 0.0]]),
    BELOW: (0.45, [0.0, -1.0], 0.3600, [[0.0, 0.0, 0.0], [0.0, 0.2000, 0.0]]),
    INSIDE: (0.55, [GRPO_ADVANTAGE, -GRPO_ADVANTAGE], -0.1780, [[-0.1571, -0.1414, -0.1340], [0.0, 0.1414, 0.0]]),
}
SIGN_LOSS = {ABOVE: -0.4325, BELOW: 0.2545}


def float64(values):
    return torch.tensor(values, dtype=torch.float64)


def example_loss(advantages):
    """The PPO-clip token mean of the example in float64, and its gradient in the log-probs."""
    log_probs = float64(PROBABILITIES).log().requires_grad_()
    ratio = torch.exp(log_probs - float64(OLD_PROBABILITIES).log())
    a = float64(advantages).unsqueeze(1)
    per_token = -torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a)
    loss = (per_token * float64(MASK)).sum() / 5
    loss.backward()
    return loss.item(), log_probs.grad


def rounded(tensor):
    return [[round(value, 4) + 0.0 for value in row] for row in tensor.tolist()]


def test_worked_example_band_and_mean_entropy():
    assert entrocraft_band((0.6, 0.4), (0.7, 0.5), "linear", 49, 100) == pytest.approx((0.5, 0.6))
    mean = float((float64(OLD_ENTROPY) * float64(MASK)).sum() / float64(MASK).sum())
    assert mean == pytest.approx(0.65)
    branches = [entrocraft_branch(h, 0.5, 0.6) for h in (0.65, 0.45, 0.55, 0.5, 0.6)]
    assert branches == [ABOVE, BELOW, INSIDE, INSIDE, INSIDE]  # the band's ends are inside it


@pytest.mark.parametrize("branch", [ABOVE, BELOW, INSIDE])
def test_worked_example_the_authors_switch(branch):
    _, advantages, loss, gradient = EXAMPLE[branch]
    grpo = torch.tensor([GRPO_ADVANTAGE, -GRPO_ADVANTAGE])
    rejected = entrocraft_advantages(torch.tensor(REWARDS), grpo, branch, "code")
    assert rejected.tolist() == pytest.approx(advantages, abs=1e-5)
    value, grad = example_loss(rejected.tolist())
    assert value == pytest.approx(loss, abs=1e-4)
    assert rounded(grad) == gradient


@pytest.mark.parametrize("branch", [ABOVE, BELOW])
def test_worked_example_the_sign_form(branch):
    grpo = torch.tensor([GRPO_ADVANTAGE, -GRPO_ADVANTAGE])
    rejected = entrocraft_advantages(torch.tensor(REWARDS), grpo, branch, "sign")
    kept = 0 if branch == ABOVE else 1
    assert rejected.tolist() == pytest.approx([grpo[i].item() if i == kept else 0.0 for i in range(2)])
    value, grad = example_loss(rejected.tolist())
    assert value == pytest.approx(SIGN_LOSS[branch], abs=1e-4)
    _, grpo_grad = example_loss(grpo.tolist())  # the GRPO gradient, restricted to the kept sequence
    assert torch.equal(grad[1 - kept], torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(grad[kept], grpo_grad[kept])


def test_the_offset_and_unscorable_rewards():
    rewards = torch.tensor([1.0, 0.0, float("nan"), 0.25])
    advantages = torch.zeros(4)
    assert entrocraft_advantages(rewards, advantages, ABOVE, "code", 0.5).tolist() == [0.5, 0.0, 0.0, 0.0]
    assert entrocraft_advantages(rewards, advantages, BELOW, "code", 0.5).tolist() == [0.0, -0.5, 0.0, -0.25]
    assert entrocraft_advantages(rewards, advantages, INSIDE, "code", 0.5) is advantages


@pytest.mark.parametrize("shape", ["linear", "cosine", "fixed"])
def test_the_band_on_the_authors_clock(shape):
    """``u = (k + 1)/K``; ``g`` linear, ``½(1 − cos πu)`` or 0; the end values in the last cycle."""
    for cycle in (0, 9, 49, 99):
        u = (cycle + 1) / 100
        g = {"linear": u, "cosine": 0.5 * (1 - math.cos(math.pi * u)), "fixed": 0.0}[shape]
        expected = (0.6 + (0.1 - 0.6) * g, 0.7 + (0.2 - 0.7) * g)
        assert entrocraft_band((0.6, 0.1), (0.7, 0.2), shape, cycle, 100) == pytest.approx(expected)
    if shape != "fixed":
        assert entrocraft_band((0.6, 0.1), (0.7, 0.2), shape, 99, 100) == pytest.approx((0.1, 0.2))


# ---------------------------------------------------------------------------------------------------------------------
# Through the trainer
# ---------------------------------------------------------------------------------------------------------------------


def example_trainer(path, tokenizer, output_dir, **options):
    """A trainer on the example's layout (groups of two), driven by hand, in the example's 50th cycle of 100."""
    options = {
        **SMALL_BATCH,
        "num_generations": 2,
        "loss_type": "bnpo",
        "epsilon": 0.2,
        "epsilon_high": 0.2,
        **options,
    }
    trainer = toy_trainer(
        EntrocraftTrainer, toy_config(EntrocraftConfig, output_dir, **options), path, tokenizer, accumulation=1
    )
    trainer.state.global_step, trainer.state.max_steps = 49, 100  # the 50th of 100 cycles: u = 50/100
    return trainer


def example_generation_batch(entropy_scale):
    """The example's generation batch as TRL leaves it off-policy: TRL's advantages and the rollout entropy."""
    return {
        "prompt_ids": torch.ones(2, 1, dtype=torch.long),
        "prompt_mask": torch.ones(2, 1, dtype=torch.long),
        "completion_ids": torch.ones(2, 3, dtype=torch.long),
        "completion_mask": torch.tensor(MASK).long(),
        "advantages": torch.tensor([GRPO_ADVANTAGE, -GRPO_ADVANTAGE]),
        OLD_ENTROPY_KEY: torch.tensor(OLD_ENTROPY) * entropy_scale,
    }


@pytest.mark.parametrize("variant", ["code", "sign"])
@pytest.mark.parametrize("branch", [ABOVE, BELOW, INSIDE])
def test_worked_example_through_the_trainer(branch, variant, toy_model_path, toy_tokenizer, tmp_path):
    trainer = example_trainer(toy_model_path, toy_tokenizer, tmp_path, entrocraft_variant=variant)
    trainer._metrics["train"].clear()
    entropy = EXAMPLE[branch][0]
    trainer.on_rewards(torch.tensor(REWARDS).unsqueeze(1))
    output = trainer.finish_generation_batch(example_generation_batch(entropy / 0.65), rows=2)
    log_probs = float64(PROBABILITIES).log().float().requires_grad_()
    batch = CompletionBatch(
        log_probs=log_probs,
        old_log_probs=float64(OLD_PROBABILITIES).log().float(),
        entropy=torch.tensor(OLD_ENTROPY),
        clamped_entropy=None,
        mask=torch.tensor(MASK),
        group_advantages=output["advantages"].unsqueeze(1),
    )
    advantages = trainer.token_advantages(batch, [])
    per_token = trainer.surrogate(batch, trainer.ratio(batch), advantages, trainer.clip_range(), [])
    _, loss = trainer.aggregate(batch, per_token, {})
    loss.backward()
    expected_loss = EXAMPLE[branch][2] if variant == "code" or branch == INSIDE else SIGN_LOSS[branch]
    assert loss.item() == pytest.approx(expected_loss, abs=1e-4)
    if variant == "code":
        assert rounded(log_probs.grad) == EXAMPLE[branch][3]
    metrics = trainer._metrics["train"]
    assert metrics["entrocraft/entropy"] == [pytest.approx(entropy, abs=1e-6)]
    assert metrics["entrocraft/lower"] == [pytest.approx(0.5)] and metrics["entrocraft/upper"] == [pytest.approx(0.6)]
    assert metrics["entrocraft/branch"] == [float(branch)]
    assert metrics["entrocraft/in_band_fraction"] == [float(branch == INSIDE)]
    zeros = sum(value == 0 for value in output["advantages"].tolist()) / 2
    assert metrics["entrocraft/zero_advantage_fraction"] == [zeros]


def test_the_cycle_count_follows_the_optimizer_steps_and_the_layout(toy_trainer_of):
    """``k``: micro-batches done over those per cycle; ``K = ceil(S · accumulation / per cycle)``."""
    trainer = toy_trainer_of("entrocraft", accumulation=4, steps_per_generation=2)
    trainer.state.max_steps = 7
    for global_step, micro_step, expected in ((0, 0, 0), (0, 2, 1), (3, 12, 6), (3, 14, 7)):
        trainer.state.global_step, trainer.micro_step = global_step, micro_step
        assert trainer.generation_cycle() == (expected, 14)
    trainer.micro_step = 0  # a resume that regenerates restarts TRL's counter: the cycle counts on from the step
    trainer.state.global_step = 3
    assert trainer.generation_cycle() == (6, 14)


def test_on_policy_the_rollout_entropy_is_one_pass_without_gradient(toy_model_path, toy_tokenizer, toy_trainer_of):
    """No rollout log-probs (on-policy TRL makes none): the trainer scores the generation batch once, without
    gradient; its mean is the float64 entropy of the full logits over the valid tokens."""
    trainer = toy_trainer_of("entrocraft")
    model = float64_model(toy_model_path)
    inputs = make_grpo_batch(model, len(toy_tokenizer), old_noise=None, ref=False)
    mask = inputs["completion_mask"].double()
    expected = float((naive_entropy(model, inputs) * mask).sum() / mask.sum())
    assert trainer.generation_batch_entropy(inputs) == pytest.approx(expected, rel=1e-5)
    assert all(p.grad is None for p in trainer.model.parameters())
    inputs[OLD_ENTROPY_KEY] = torch.full_like(mask, 2.5).float()  # off-policy: TRL's rollout pass, kept
    assert trainer.generation_batch_entropy(inputs) == pytest.approx(2.5)


def test_the_previous_cycles_entropy_is_measured_and_read_one_cycle_late(toy_model_path, toy_tokenizer, tmp_path):
    """``previous_cycle``: the first cycle keeps GRPO's advantages (nothing measured yet), each later cycle reads the
    previous cycle's training-pass token mean of the entropy (one micro-batch per cycle here: TRL's logged mean)."""
    args = toy_config(
        EntrocraftConfig,
        tmp_path,
        **SMALL_BATCH,
        max_steps=3,
        logging_steps=1,
        entrocraft_entropy_source="previous_cycle",
    )
    trainer = toy_trainer(EntrocraftTrainer, args, toy_model_path, toy_tokenizer)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert "entrocraft/entropy" not in logs[0] and logs[0]["entrocraft/branch"] == INSIDE
    for before, after in zip(logs, logs[1:], strict=False):
        assert after["entrocraft/entropy"] == pytest.approx(before["entropy"], rel=1e-5)
    assert trainer.controllers["entrocraft"].state_dict() == {"value": pytest.approx(logs[-1]["entropy"], rel=1e-5)}


def test_the_previous_cycles_entropy_over_its_valid_tokens_decides_the_next_batch(
    toy_model_path, toy_tokenizer, tmp_path
):
    """The quick loop's check of the training run's fact above, over two generation batches driven by hand (one
    micro-batch per cycle): the first keeps GRPO's advantages; the cycle's training entropy, its mean over the valid
    tokens (the padded position's 9 nats left out: 0.65, above the band [0.5, 0.6]), rejects the second's negatives."""
    trainer = example_trainer(toy_model_path, toy_tokenizer, tmp_path, entrocraft_entropy_source="previous_cycle")
    trainer._metrics["train"].clear()
    set_sync(trainer, True)
    rewards = torch.tensor(REWARDS).unsqueeze(1)
    trainer.on_rewards(rewards)
    first = trainer.finish_generation_batch(example_generation_batch(1.0), rows=2)
    assert first["advantages"].tolist() == pytest.approx([GRPO_ADVANTAGE, -GRPO_ADVANTAGE], abs=1e-5)
    entropy = torch.tensor(OLD_ENTROPY).masked_fill(~torch.tensor(MASK).bool(), 9.0)
    probabilities = float64(PROBABILITIES).float()
    batch = CompletionBatch(
        log_probs=probabilities.log(),
        old_log_probs=probabilities.log(),
        entropy=entropy,
        clamped_entropy=None,
        mask=torch.tensor(MASK),
        group_advantages=first["advantages"].unsqueeze(1),
    )
    trainer.after_loss_step(LossStep(torch.tensor(0.0), batch, []))
    mean = float((float64(OLD_ENTROPY) * float64(MASK)).sum() / float64(MASK).sum())
    trainer.state.global_step += 1
    trainer.on_rewards(rewards)
    second = trainer.finish_generation_batch(example_generation_batch(1.0), rows=2)
    assert second["advantages"].tolist() == [1.0, 0.0]  # RAFT++: max(R − 0, 0)
    metrics = trainer._metrics["train"]
    assert metrics["entrocraft/branch"] == [INSIDE, ABOVE]
    assert metrics["entrocraft/entropy"] == [pytest.approx(mean, rel=1e-6)] and mean == pytest.approx(0.65)


# ---------------------------------------------------------------------------------------------------------------------
# The config
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"entrocraft_lower_start": 0.8}, "entrocraft_lower_start=0.8 is above entrocraft_upper_start=0.7"),
        ({"entrocraft_lower_end": 0.6}, "entrocraft_lower_end=0.6 is above entrocraft_upper_end=0.5"),
        ({"entrocraft_shape": "fixed", "entrocraft_upper_end": 0.9}, "entrocraft_upper_end=0.9 would be ignored"),
        ({"entrocraft_variant": "random"}, "entrocraft_variant"),
        ({"entrocraft_lower_start": -0.1}, "entrocraft_lower_start"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(options, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        toy_config(EntrocraftConfig, tmp_path, **options)


def test_rewards_never_below_the_offset_warn_once_when_nothing_moves(toy_model_path, toy_tokenizer, tmp_path):
    trainer = example_trainer(toy_model_path, toy_tokenizer, tmp_path)
    for rewards in ([1.0, 0.0], [0.0, 1.0]):  # 0/1 rewards, entropy below the band: NSR keeps nothing
        trainer.on_rewards(torch.tensor(rewards).unsqueeze(1))
        with (
            pytest.warns(UserWarning, match="entrocraft_reward_offset=0.0")
            if rewards[0]
            else warnings.catch_warnings()
        ):
            if not rewards[0]:
                warnings.simplefilter("error")
            output = trainer.finish_generation_batch(example_generation_batch(0.45 / 0.65), rows=2)
        assert output["advantages"].tolist() == [0.0, 0.0]


# ---------------------------------------------------------------------------------------------------------------------
# Every loss type: the loss and every gradient against float64
# ---------------------------------------------------------------------------------------------------------------------

LOSS_CASES = LOSS_TYPE_CASES
assert set(LOSS_CASES) == set(LOSS_TYPES)  # every loss type: Entrocraft acts before any surrogate, it refuses none
# Rewards whose sign about the offset 0.5 is mixed, and whose GRPO advantages are too: both rejections act.
BATCH_REWARDS = torch.tensor([1.0, 0.0, 0.75, 0.25])


@pytest.mark.parametrize("variant", ["code", "sign"])
@pytest.mark.parametrize("side", [ABOVE, BELOW])
@pytest.mark.parametrize("loss_type", LOSS_CASES)
def test_loss_and_every_gradient_equal_a_float64_loss(
    loss_type, side, variant, toy_model_path, toy_tokenizer, toy_trainer_of
):
    """A band [0, 0] (every entropy above it) or [50, 50] (below it), through the trainer's generation tail, then
    the loss step; against the loss type's float64 loss on the advantages written out here from the rewards."""
    band = 0.0 if side == ABOVE else 50.0
    options = dict(entrocraft_shape="fixed", entrocraft_lower_start=band, entrocraft_upper_start=band)
    options |= {"entrocraft_variant": variant} | ({"entrocraft_reward_offset": 0.5} if variant == "code" else {})
    ours = toy_trainer_of("entrocraft", loss_type=loss_type, num_iterations=2, **LOSS_CASES[loss_type], **options)
    inputs = make_grpo_batch(ours.model, len(toy_tokenizer), seed=list(LOSS_CASES).index(loss_type))
    rewards = BATCH_REWARDS.double()
    grpo = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
    inputs["advantages"] = grpo.float()  # TRL's, as its generation made them
    ours.on_rewards(BATCH_REWARDS.unsqueeze(1))
    inputs = ours.finish_generation_batch(inputs, rows=4)
    if variant == "code":
        expected = (rewards - 0.5).clamp(min=0) if side == ABOVE else (rewards - 0.5).clamp(max=0)
    else:
        expected = grpo * (grpo >= 0) if side == ABOVE else grpo * (grpo <= 0)
    assert (expected == 0).any() and (expected != 0).any()  # some rollouts rejected, some kept
    torch.testing.assert_close(inputs["advantages"].double(), expected, rtol=1e-6, atol=1e-7)
    our_loss, our_grads = loss_and_gradients(ours, inputs)

    reference = float64_model(toy_model_path)
    log_probs, _, _ = scores(reference, inputs)
    loss = float64_loss(loss_type, ours.args, log_probs, {**inputs, "advantages": expected})
    assert_step_is_float64(our_loss, our_grads, loss, reference)


# The pair table's piece (tests/compose/test_pairs.py): each variant's rejection, and the refusal of the two together.


def pair_band_side(old_entropy, mask, s):
    """Entrocraft (arXiv:2604.26326), with a fixed band ``[L, U]``: whether the rollout policy's token-mean entropy
    ``H̄`` is above ``U``, and whether it is below ``L``."""
    mean_entropy = float((old_entropy * mask).sum() / mask.sum())
    return mean_entropy > s["entrocraft_upper_start"], mean_entropy < s["entrocraft_lower_start"]


def pair_reward_rejection(rewards, advantages, old_entropy, mask, s):
    """The authors' code (``entrocraft``): above the band ``max(R − b₀, 0)`` of the raw reward, rejecting the negative
    rollouts, below it ``min(R − b₀, 0)``, rejecting the positive ones."""
    above, below = pair_band_side(old_entropy, mask, s)
    if not (above or below):
        return advantages
    shifted = (rewards.double() - s.get("entrocraft_reward_offset", 0.0)).unsqueeze(1)
    return shifted.clamp(min=0) if above else shifted.clamp(max=0)


def pair_sign_rejection(rewards, advantages, old_entropy, mask, s):
    """The sign form (``entrocraft_sign``): the advantages of the rejected sign zeroed."""
    above, below = pair_band_side(old_entropy, mask, s)
    if not (above or below):
        return advantages
    return advantages * ((advantages >= 0) if above else (advantages <= 0))


PAIR = PairReference(
    # The band [0, 0]: every batch's entropy is above it, so the negative rollouts are rejected.
    settings=dict(entrocraft_shape="fixed", entrocraft_lower_start=0.0, entrocraft_upper_start=0.0),
    methods={
        # Its shifted rewards stand in for the baseline's advantages: the baseline's axis, once the band is read.
        "entrocraft": PairMethod("group baseline", rollout_rejection=pair_reward_rejection),
        "entrocraft_sign": PairMethod("rollout rejection", rollout_rejection=pair_sign_rejection),
    },
    # Two names of one method, each standing for another variant.
    refused={("entrocraft", "entrocraft_sign"): "set entrocraft_variant to different defaults"},
)
