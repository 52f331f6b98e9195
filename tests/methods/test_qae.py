"""QAE (Wu et al., "Quantile Advantage Estimation for Entropy-Safe Reasoning", arXiv:2509.22611; docs/qae.md): the
K-quantile baseline and the advantages against a float64 reading of the formula written out here, the base's
rebaselining plumbing against TRL's own advantages, the loss step against trl.GRPOTrainer fed the reference
advantages, and a training run whose generation batches carry the reference advantages and the gate's metrics.
Checkpoints: tests/trainer/test_resume.py; accumulation: tests/trainer/test_accumulation.py; bad values:
tests/trainer/test_bad_input.py."""

import math
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from _reference.pairs import PairMethod, PairReference
from _support.grpo import loss_and_gradients, make_grpo_batch, toy_config, toy_trainer
from _support.parity import TRL
from trl import GRPOTrainer

from trl_entropy import EntropyGRPOTrainer, QAEConfig, QAETrainer
from trl_entropy.core.config import EntropyGRPOBaseConfig
from trl_entropy.core.parts import MethodPart
from trl_entropy.core.trl.advantages import advantages_around_baseline
from trl_entropy.methods.qae import qae_gate_metrics, quantile_baseline
from trl_entropy.toy import build_toy_dataset


nan = math.nan

# ---------------------------------------------------------------------------------------------------------------------
# The formula, written out in float64
# ---------------------------------------------------------------------------------------------------------------------


def spec_quantile(rewards, k):
    """Q_K of the valid (non-NaN) rewards: sort them, position h = K·(n−1), interpolate linearly between the order
    statistics ⌊h⌋ and ⌈h⌉ (torch.quantile's default, as the authors' code calls it); NaN when none is valid."""
    values = sorted(r for r in rewards if not math.isnan(r))
    if not values:
        return nan
    position = k * (len(values) - 1)
    below, above = math.floor(position), math.ceil(position)
    return values[below] + (position - below) * (values[above] - values[below])


def spec_std(values):
    """Bessel-corrected standard deviation of the valid values around their mean (NaN for fewer than two)."""
    values = [v for v in values if not math.isnan(v)]
    if len(values) < 2:
        return nan
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def spec_advantages(rewards, group_size, k, scale_rewards):
    """A_i = (r_i − Q_K(group)) / (std + 1e-4), std of the group ("group") or of the batch ("batch"), undivided for
    "none"; 0 where the reward is unscorable (NaN). k=None: the group mean (plain GRPO)."""
    result = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        valid = [r for r in group if not math.isnan(r)]
        baseline = (sum(valid) / len(valid) if valid else nan) if k is None else spec_quantile(group, k)
        std = {"group": spec_std(group), "batch": spec_std(rewards), "none": None}[scale_rewards]
        for reward in group:
            advantage = reward - baseline if std is None else (reward - baseline) / (std + 1e-4)
            result.append(0.0 if math.isnan(advantage) else advantage)
    return result


GROUPS = {
    "all_correct": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
    "all_wrong": [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    "one_success": [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    "one_failure": [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0],
    "half": [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0],
    "partly_unscorable": [1.0, nan, 0.0, nan, 1.0, 1.0, 0.0, nan],
    "unscorable": [nan] * 8,
    "non_binary": [0.3, -1.2, 2.5, 0.3, 0.9, 4.0, -0.1, 1.7],
    "non_binary_ties_nan": [0.5, 0.5, nan, 2.0, 0.5, -3.0, 2.0, 0.5],
}
KS = [0.1, 0.25, 0.4, 0.5, 0.6, 0.8, 0.95]


@pytest.mark.parametrize("group_size", [8, 4, 2])
@pytest.mark.parametrize("k", KS)
def test_quantile_baseline_follows_the_formula(k, group_size):
    rewards = [r for group in GROUPS.values() for r in group]
    expected = [spec_quantile(rewards[i : i + group_size], k) for i in range(0, len(rewards), group_size)]
    result = quantile_baseline(torch.tensor(rewards, dtype=torch.float64).view(-1, group_size), k)
    torch.testing.assert_close(result, torch.tensor(expected, dtype=torch.float64), equal_nan=True)
    result32 = quantile_baseline(torch.tensor(rewards).view(-1, group_size), k)  # TRL's rewards are float32
    expected64 = torch.tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(result32.double(), expected64, rtol=1e-6, atol=1e-6, equal_nan=True)


def test_binary_groups_fall_into_the_two_regimes():
    """Binary rewards, G = 16, K = 0.4 (K·(G−1) = 6, no interpolation): b = 0 for p ≤ 1 − K, b = 1 above."""
    for successes in range(17):
        group = torch.tensor([[1.0] * successes + [0.0] * (16 - successes)])
        expected = 0.0 if successes / 16 <= 1 - 0.4 else 1.0
        assert quantile_baseline(group, 0.4).item() == expected, successes


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
@pytest.mark.parametrize("k", KS)
def test_advantages_follow_the_formula(k, scale_rewards):
    rewards = [r for group in GROUPS.values() for r in group]
    tensor = torch.tensor(rewards, dtype=torch.float64)
    result = advantages_around_baseline(tensor, 8, scale_rewards, quantile_baseline(tensor.view(-1, 8), k))
    torch.testing.assert_close(
        result, torch.tensor(spec_advantages(rewards, 8, k, scale_rewards), dtype=torch.float64)
    )


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_mean_baseline_gives_the_formulas_grpo_advantages(scale_rewards):
    rewards = [r for group in GROUPS.values() for r in group]
    result = advantages_around_baseline(torch.tensor(rewards, dtype=torch.float64), 8, scale_rewards)
    expected = spec_advantages(rewards, 8, None, scale_rewards)
    torch.testing.assert_close(result, torch.tensor(expected, dtype=torch.float64))


def test_gate_metrics():
    grouped = torch.tensor([GROUPS[name] for name in ("all_wrong", "one_success", "one_failure", "partly_unscorable")])
    baseline = quantile_baseline(grouped, 0.4)  # 0, 0, 1, 1 (valid 1, 0, 1, 1, 0: sorted 0 0 1 1 1, h = 1.6)
    assert baseline.tolist() == pytest.approx([0.0, 0.0, 1.0, 0.6])
    metrics = qae_gate_metrics(grouped, baseline)
    # zero advantage: 8 (all wrong) + 7 (failures) + 7 (successes) + 3 (unscorable) of 32
    assert metrics["qae/zero_advantage_fraction"] == pytest.approx(25 / 32)
    assert metrics["qae/hard_group_fraction"] == pytest.approx(1 / 4)  # one_success (all_wrong: rewards all equal)
    assert metrics["qae/easy_group_fraction"] == pytest.approx(1 / 4)  # one_failure (partly_unscorable: interpolated)


def spec_gate_metrics(groups, k):
    """QAE's gate on a batch of groups, from the definitions (docs/qae.md, "Metrics"): a completion has advantage 0
    when it is unscorable or its reward equals its group's baseline Q_K; a group is hard (easy) when its valid rewards
    differ and the baseline is the lowest (highest) of them. Fractions of all completions and of all groups."""
    zero = hard = easy = 0
    for group in groups:
        valid = [r for r in group if not math.isnan(r)]
        baseline = spec_quantile(group, k)
        zero += len(group) - len(valid) + sum(r == baseline for r in valid)
        differ = len(set(valid)) > 1
        hard += differ and baseline == min(valid)
        easy += differ and baseline == max(valid)
    return {
        "qae/zero_advantage_fraction": zero / sum(len(group) for group in groups),
        "qae/hard_group_fraction": hard / len(groups),
        "qae/easy_group_fraction": easy / len(groups),
    }


# Groups holding unscorable rewards, and the regime each is in at K = 0.4 (None: neither).
UNSCORABLE_GROUPS = {
    "equal_scorable_wrong": ([0.0, nan, 0.0, 0.0, nan, 0.0, 0.0, 0.0], None),
    "equal_scorable_right": ([1.0, 1.0, nan, 1.0, 1.0, 1.0, 1.0, 1.0], None),
    "one_scorable": ([nan, nan, nan, 1.0, nan, nan, nan, nan], None),
    "one_unscorable_hard": ([0.0, 0.0, 1.0, 0.0, nan, 0.0, 0.0, 0.0], "hard"),
    "one_unscorable_easy": ([1.0, 1.0, 0.0, 1.0, nan, 1.0, 1.0, 1.0], "easy"),
    "one_unscorable_graded": ([0.5, nan, 2.0, 0.5, -3.0, 2.0, 0.5, 0.5], None),  # b = 0.5, strictly inside
    "unscorable": ([nan] * 8, None),
}
# Scorable neighbours in the same batch (one hard, one easy), so that every fraction counts the whole batch.
NEIGHBOURS = [GROUPS["one_success"], GROUPS["one_failure"]]


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("name", sorted(UNSCORABLE_GROUPS))
def test_gate_metrics_on_groups_holding_unscorable_rewards(name, k):
    group, regime = UNSCORABLE_GROUPS[name]
    assert sum(map(math.isnan, group)) > 0
    at_04 = spec_gate_metrics([group], 0.4)
    assert (at_04["qae/hard_group_fraction"], at_04["qae/easy_group_fraction"]) == (regime == "hard", regime == "easy")
    for groups in ([group], [group, *NEIGHBOURS], [*NEIGHBOURS, group, group]):
        expected = spec_gate_metrics(groups, k)
        for dtype in (torch.float32, torch.float64):  # TRL's rewards are float32
            grouped = torch.tensor(groups, dtype=dtype)
            assert qae_gate_metrics(grouped, quantile_baseline(grouped, k)) == pytest.approx(expected), (groups, dtype)


# ---------------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------------


def test_config_default_is_the_authors_k(tmp_path):
    config = toy_config(QAEConfig, tmp_path)
    assert config.qae_quantile_k == 0.4
    with pytest.raises(ValueError, match="normalize_then_sum"):
        toy_config(QAEConfig, tmp_path, multi_objective_aggregation="normalize_then_sum")


# ---------------------------------------------------------------------------------------------------------------------
# Training runs: the advantages written into the generation batch
# ---------------------------------------------------------------------------------------------------------------------


CALLS = [0]


def varied_reward(completions, **kwargs):
    """Binary by the completion's characters, None (unscorable) for one completion in five: mixed, all-equal and
    partly unscorable groups."""
    CALLS[0] += 1
    return [
        None if (index + CALLS[0]) % 5 == 0 else float(sum(map(ord, c)) % 3 == 0)
        for index, c in enumerate(completions)
    ]


def graded_reward(completions, **kwargs):
    """A non-binary reward with ties."""
    return [(sum(map(ord, c)) % 5) / 4 for c in completions]


class Recording:
    """Records, on every generation batch, the gathered rewards and the advantages written into the batch."""

    def finish_generation_batch(self, output, rows):
        output = super().finish_generation_batch(output, rows)
        self.recorded.append((self._gathered_rewards.clone(), output["advantages"].clone()))
        return output


class RecordingQAE(Recording, QAETrainer):
    pass


class MeanBaselinePart(MethodPart):
    """The base's rebaselining path with TRL's own baseline: must give TRL's advantages bit for bit."""

    key = "mean_baseline"

    def group_baseline(self, grouped_rewards):
        return torch.nanmean(grouped_rewards, dim=1), {}


@dataclass
class MeanBaselineConfig(EntropyGRPOBaseConfig):
    method_parts: ClassVar[tuple[type, ...]] = (MeanBaselinePart,)


class MeanBaseline(Recording, EntropyGRPOTrainer):
    config_class = MeanBaselineConfig


def run(trainer_class, config_class, path, tokenizer, tmp_path, reward_funcs, **options):
    args = toy_config(
        config_class,
        tmp_path,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=6,
        max_steps=2,
        logging_steps=1,
        **options,
    )
    trainer = toy_trainer(trainer_class, args, path, tokenizer, reward_funcs, build_toy_dataset(32, seed=0))
    trainer.recorded = []
    trainer.train()
    return trainer


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
@pytest.mark.parametrize("weights", [[1.0], [1.0, 0.5]], ids=["one_function", "two_functions"])
def test_mean_baseline_reproduces_trls_advantages(
    toy_model_path, toy_tokenizer, tmp_path, monkeypatch, scale_rewards, weights
):
    trl_advantages = []
    original = GRPOTrainer._generate_and_score_completions

    def spy(self, inputs):
        output = original(self, inputs)
        trl_advantages.append(output["advantages"].clone())
        return output

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", spy)
    trainer = run(
        MeanBaseline,
        MeanBaselineConfig,
        toy_model_path,
        toy_tokenizer,
        tmp_path,
        [varied_reward, graded_reward][: len(weights)],
        scale_rewards=scale_rewards,
        reward_weights=weights,
    )
    assert len(trl_advantages) == len(trainer.recorded) > 0
    for trl_value, (rewards, ours) in zip(trl_advantages, trainer.recorded, strict=True):
        assert torch.isnan(rewards).any()  # unscorable rewards (None) are exercised
        assert torch.equal(ours, trl_value)


@pytest.mark.parametrize(("k", "scale_rewards"), [(0.4, "group"), (0.25, "batch"), (0.8, "none")])
@pytest.mark.parametrize("rewards", ["binary", "graded"])
def test_generation_batch_carries_the_formulas_advantages(
    toy_model_path, toy_tokenizer, tmp_path, k, scale_rewards, rewards
):
    reward_funcs = varied_reward if rewards == "binary" else [varied_reward, graded_reward]
    trainer = run(
        RecordingQAE,
        QAEConfig,
        toy_model_path,
        toy_tokenizer,
        tmp_path,
        reward_funcs,
        qae_quantile_k=k,
        scale_rewards=scale_rewards,
    )
    assert trainer.recorded
    if rewards == "binary":  # unscorable completions (every function returned None) are exercised
        assert any(torch.isnan(per_func).all(dim=1).any() for per_func, _ in trainer.recorded)
    logged = [entry for entry in trainer.state.log_history if "qae/zero_advantage_fraction" in entry]
    assert len(logged) == len(trainer.recorded)  # one generation batch per logged step
    for (per_func, advantages), entry in zip(trainer.recorded, logged, strict=True):
        summed = [
            nan if all(math.isnan(v) for v in row) else sum(v for v in row if not math.isnan(v))
            for row in per_func.double().tolist()
        ]
        expected = spec_advantages(summed, 4, k, scale_rewards)
        torch.testing.assert_close(
            advantages.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-5
        )
        gate = spec_gate_metrics([summed[i : i + 4] for i in range(0, len(summed), 4)], k)  # sums of quarters: exact
        assert {name: entry[name] for name in gate} == pytest.approx(gate)


# ---------------------------------------------------------------------------------------------------------------------
# Loss step: trl.GRPOTrainer fed the reference advantages
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_loss_and_gradients_equal_grpo_trainer_with_the_formulas_advantages(loss_type, toy_trainer_of):
    trl_trainer = toy_trainer_of(TRL, "trl", loss_type=loss_type)
    ours = toy_trainer_of("qae", "ours", loss_type=loss_type)
    inputs = make_grpo_batch(ours.model, ours.model.config.vocab_size, seed=3)
    inputs["advantages"] = torch.tensor(spec_advantages([1.0, 0.0, 0.0, 0.0], 4, 0.4, "group"), dtype=torch.float32)
    assert inputs["advantages"].tolist() == pytest.approx([1 / (0.5 + 1e-4), 0.0, 0.0, 0.0])
    our_loss, our_grads = loss_and_gradients(ours, inputs)
    trl_loss, trl_grads = loss_and_gradients(trl_trainer, inputs)
    torch.testing.assert_close(our_loss, trl_loss, rtol=1e-5, atol=1e-7)
    assert our_grads.keys() == trl_grads.keys()
    for name in trl_grads:
        torch.testing.assert_close(our_grads[name], trl_grads[name], rtol=1e-4, atol=1e-6, msg=name)


# The pair table's piece (tests/compose/test_pairs.py): the group baseline.


def pair_quantile_baseline(rewards, s):
    """QAE (arXiv:2509.22611): the K-quantile of the group's rewards, linearly interpolated."""
    ordered = rewards.sort().values
    position = s["qae_quantile_k"] * (len(ordered) - 1)
    low = math.floor(position)
    return ordered[low] + (position - low) * (ordered[min(low + 1, len(ordered) - 1)] - ordered[low])


PAIR = PairReference(
    settings=dict(qae_quantile_k=0.4),
    methods={"qae": PairMethod("group baseline", group_baseline=pair_quantile_baseline)},
)
