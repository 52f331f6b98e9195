"""STEER, token reweighting by the estimated entropy change (Hao, Wang et al., arXiv:2510.10150; the authors' code,
zz-haooo/STEER at b31df71; docs/steer.md).

* the worked example of docs/steer.md number for number, for both mappings: Ω, the weights, the loss and its gradient,
  as pure functions against the float64 formulas written out here, and through the trainer's loss step;
* the edges: equal |Ω| under the linear map, a non-finite Ω (counted, weight as for 0), masked tokens, the floor on
  μ_max, the on-policy case where STEER still acts;
* the config: its refusals, naming the fields;
* the layout: the weights are per micro-batch (as the authors'), so one micro-batch of two sequences differs from two
  of one, and a fixed layout reproduces.

The shared suites (loss types and the neutral setting against trl.GRPOTrainer, bad input, resume, accumulation, two
processes, combinations, docs) cover STEER through the registry."""

import math

import pytest
import torch
from _reference.combined_reference import scores
from _reference.float64_policy import assert_step_is_float64, float64_model
from _reference.loss_types_reference import float64_loss
from _reference.pairs import PairMethod, PairReference
from _support.grpo import SMALL_BATCH, loss_and_gradients, make_grpo_batch, toy_config

from trl_entropy.core.batch import OLD_ENTROPY_KEY, CompletionBatch
from trl_entropy.core.trl.objectives import LOSS_TYPES
from trl_entropy.methods.steer import STEERConfig, STEERPart, steer_omega, steer_weights


# The worked example: two sequences of three tokens, the last token of the second masked; ε 0.2 / 0.28, dual clip 10.
PROBABILITIES = [[0.9, 0.5, 0.21], [0.6, 0.05, 0.95]]
OLD_PROBABILITIES = [[0.8, 0.5, 0.25], [0.7, 0.10, 0.90]]
OLD_ENTROPY = [[0.3, 1.2, 2.0], [0.8, 2.5, 0.2]]
ADVANTAGES = [[1.0], [-1.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
OMEGA = [[0.0219, 0.2534, 0.2916], [-0.0991, 0.2355]]
WEIGHTS = {
    "exponential": [[0.9834, 0.8237, 0.8000], [0.9269, 0.8351, 0.0]],
    "linear": [[1.2000, 0.8566, 0.8000], [1.0854, 0.8832, 0.0]],
}
LOSS = {"exponential": -0.2279, "linear": -0.2483, "plain": -0.2616}
GRADIENT = {
    "exponential": [[-0.2213, -0.1647, -0.1344], [0.1589, 0.0, 0.0]],
    "linear": [[-0.2700, -0.1713, -0.1344], [0.1861, 0.0, 0.0]],
    "plain": [[-0.2250, -0.2000, -0.1680], [0.1714, 0.0, 0.0]],
}
OPTIONS = {"exponential": {}, "linear": {"steer_mapping": "linear", "steer_weight_min": 0.8, "steer_weight_max": 1.2}}


def log(values):
    return torch.tensor(values, dtype=torch.float64).log()


def reference_weights(mapping):
    """Ω and the weights from the formulas, in float64, at the valid tokens."""
    p, p_old, h_old = (torch.tensor(v, dtype=torch.float64) for v in (PROBABILITIES, OLD_PROBABILITIES, OLD_ENTROPY))
    a = torch.tensor(ADVANTAGES, dtype=torch.float64)
    omega = a / p_old * p * (1 - p) * (p.log() + h_old)
    valid = torch.tensor(MASK).bool()
    mu = omega.abs()
    if mapping == "exponential":
        kappa = -math.log(0.8) / max(float(mu[valid].max()), 0.02)
        weights = torch.exp(-kappa * mu).clamp(0.8, 1.0)
    else:
        low, high = mu[valid].min(), mu[valid].max()
        weights = (1.2 - (mu - low) * 0.4 / (high - low)).clamp(0.8, 1.2)
    return omega, torch.where(valid, weights, torch.zeros_like(weights))


def dual_clip_surrogate(log_probs):
    """The PPO surrogate with the dual clip of negative advantages (c = 10), per token, in float64."""
    ratio = torch.exp(log_probs - log(OLD_PROBABILITIES))
    a = torch.tensor(ADVANTAGES, dtype=torch.float64)
    loss = torch.maximum(-ratio * a, -ratio.clamp(0.8, 1.28) * a)
    return torch.where(a < 0, torch.minimum(loss, -10.0 * a), loss)


@pytest.mark.parametrize("mapping", ["exponential", "linear"])
def test_worked_example_omega_and_weights(mapping):
    omega, finite = steer_omega(
        log(PROBABILITIES), log(OLD_PROBABILITIES), torch.tensor(OLD_ENTROPY), torch.tensor(ADVANTAGES)
    )
    expected_omega, expected_weights = reference_weights(mapping)
    valid = torch.tensor(MASK).bool()
    torch.testing.assert_close(omega[valid].double(), expected_omega[valid], rtol=1e-5, atol=1e-7)
    assert [round(v, 4) for v in omega[valid].tolist()] == [v for row in OMEGA for v in row]
    weights = steer_weights(omega, torch.tensor(MASK), mapping, 0.8, 1.2)
    torch.testing.assert_close(weights.double(), expected_weights, rtol=1e-5, atol=1e-7)
    assert [[round(v, 4) for v in row] for row in weights.tolist()] == WEIGHTS[mapping]
    assert finite.all()


@pytest.mark.parametrize("mapping", ["exponential", "linear", "plain"])
def test_worked_example_loss_and_gradient_with_the_weights_held(mapping):
    log_probs = log(PROBABILITIES).requires_grad_()
    weights = torch.ones(2, 3, dtype=torch.float64) if mapping == "plain" else reference_weights(mapping)[1]
    mask = torch.tensor(MASK, dtype=torch.float64)
    loss = (weights * dual_clip_surrogate(log_probs) * mask).sum() / mask.sum()
    loss.backward()
    assert loss.item() == pytest.approx(LOSS[mapping], abs=1e-4)
    assert [[round(v, 4) + 0.0 for v in row] for row in log_probs.grad.tolist()] == GRADIENT[mapping]


@pytest.fixture(params=["exponential", "linear"])
def example_trainer(request, toy_trainer_of):
    trainer = toy_trainer_of(
        "steer",
        loss_type="bnpo",  # the token mean over the micro-batch
        epsilon=0.2,
        epsilon_high=0.28,
        delta=10.0,
        **OPTIONS[request.param],
    )
    return request.param, trainer


def test_worked_example_through_the_trainer(example_trainer):
    mapping, trainer = example_trainer
    trainer._metrics["train"].clear()
    log_probs = log(PROBABILITIES).float().requires_grad_()
    batch = CompletionBatch(
        log_probs=log_probs,
        old_log_probs=log(OLD_PROBABILITIES).float(),
        entropy=torch.tensor(OLD_ENTROPY) + 0.5,  # this pass's entropy: STEER reads the rollout's
        clamped_entropy=None,
        mask=torch.tensor(MASK),
        group_advantages=torch.tensor(ADVANTAGES),
        # A corrupt rollout entropy at the padded position: its Ω is not finite, and it counts nowhere.
        old_entropy=torch.tensor(OLD_ENTROPY).masked_fill(~torch.tensor(MASK).bool(), math.inf),
    )
    measured = []
    advantages = trainer.token_advantages(batch, measured)
    ratio = trainer.ratio(batch)
    per_token = trainer.surrogate(batch, ratio, advantages, trainer.clip_range(), measured)
    per_token = trainer.apply_gates(batch, ratio, advantages, per_token, {}, measured)
    trainer.record_metrics(batch.mode, measured)
    _, loss = trainer.aggregate(batch, per_token, {})
    loss.backward()
    assert loss.item() == pytest.approx(LOSS[mapping], abs=1e-4)
    torch.testing.assert_close(log_probs.grad, torch.tensor(GRADIENT[mapping]), rtol=0, atol=1e-4)
    metrics = trainer._metrics["train"]
    expected = reference_weights(mapping)[1]
    assert metrics["steer/weight_mean"] == [pytest.approx(float(expected.sum() / 5), abs=1e-6)]
    assert metrics["steer/weight_min"] == [pytest.approx(0.8)]
    assert metrics["steer/omega_abs_max"] == [pytest.approx(0.2916, abs=1e-4)]
    omega = reference_weights(mapping)[0].abs()[torch.tensor(MASK).bool()]
    assert metrics["steer/omega_abs_mean"] == [pytest.approx(float(omega.mean()), rel=1e-5)]
    assert metrics["steer/nonfinite_fraction"] == [0.0]


# ---------------------------------------------------------------------------------------------------------------------
# Edges
# ---------------------------------------------------------------------------------------------------------------------


def test_equal_estimates_give_the_middle_weight_under_the_linear_map():
    omega = torch.full((2, 3), 0.3)
    weights = steer_weights(omega, torch.tensor(MASK), "linear", 0.8, 1.2)
    assert weights.flatten().tolist() == pytest.approx([1.0, 1.0, 1.0, 1.0, 1.0, 0.0])


def test_the_floor_on_the_largest_estimate_keeps_small_estimates_near_one():
    """Below μ_max = 0.02, κ uses the floor: no token reaches λ_min."""
    omega = torch.tensor([[0.001, 0.01]])
    weights = steer_weights(omega, torch.ones(1, 2), "exponential", 0.8)
    kappa = -math.log(0.8) / 0.02
    assert weights[0].tolist() == pytest.approx([math.exp(-kappa * 0.001), math.exp(-kappa * 0.01)])
    assert weights.min() > 0.8


def test_a_non_finite_estimate_counts_as_zero_and_is_counted():
    """An infinite rollout entropy (a corrupted batch) gives a non-finite Ω: weight as Ω = 0, logged as a fraction."""
    omega, finite = steer_omega(
        torch.log(torch.tensor([[0.5, 0.5]])),
        torch.log(torch.tensor([[0.5, 0.5]])),
        torch.tensor([[math.inf, 1.0]]),
        torch.tensor([[1.0]]),
    )
    assert finite.tolist() == [[False, True]] and omega[0, 0] == 0.0 and omega[0, 1] > 0
    assert steer_weights(omega, torch.ones(1, 2), "exponential", 0.8)[0, 0] == 1.0


def test_masked_tokens_weigh_nothing_and_leave_the_range_alone():
    omega = torch.tensor([[0.1, 0.2, 50.0]])
    weights = steer_weights(omega, torch.tensor([[1.0, 1.0, 0.0]]), "linear", 0.8, 1.2)
    assert weights[0].tolist() == pytest.approx([1.2, 0.8, 0.0])  # the masked 50 sets neither μ_min nor μ_max


def test_on_policy_steer_still_acts():
    """Ω = A (1 − p)(ℓ + H) on-policy: the weights vary with the tokens, unlike ERC's or CE-GPPO's."""
    log_probs = torch.log(torch.tensor([[0.9, 0.3, 0.6]]))
    entropy = torch.tensor([[0.2, 1.5, 0.7]])
    omega, _ = steer_omega(log_probs, log_probs, entropy, torch.tensor([[1.0]]))
    p = log_probs.exp()
    torch.testing.assert_close(omega, (1 - p) * (log_probs + entropy))
    weights = steer_weights(omega, torch.ones(1, 3), "exponential", 0.8)
    assert len(set(weights[0].tolist())) == 3 and weights.min() == pytest.approx(0.8)


# ---------------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"steer_weight_min": 0.0}, "steer_weight_min=0.0 is invalid for steer_mapping='exponential'"),
        ({"steer_weight_min": 1.5}, "must lie in \\(0, 1\\]"),
        ({"steer_weight_max": 2.0}, "steer_weight_max=2.0 would be ignored"),
        ({"steer_mapping": "linear", "steer_weight_min": 1.3}, "steer_weight_max=1.2 is below steer_weight_min=1.3"),
        ({"importance_sampling_level": "sequence"}, "importance_sampling_level='sequence' is not supported by STEER"),
        ({"steer_mapping": "log"}, "steer_mapping='log' is invalid"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(options, message):
    with pytest.raises(ValueError, match=message):
        toy_config(STEERConfig, **SMALL_BATCH, **options)


def test_steer_reads_the_rollout_entropy_from_the_pass_erc_uses():
    """H^old is the rollout policy's, carried from the pass that computes TRL's rollout log-probs."""
    assert STEERPart.needs_rollout_entropy


def test_the_defaults_are_the_papers_exponential_map():
    config = toy_config(STEERConfig, **SMALL_BATCH)
    assert (config.steer_mapping, config.steer_weight_min, config.steer_weight_max) == ("exponential", 0.8, 1.2)


# ---------------------------------------------------------------------------------------------------------------------
# Layout: per micro-batch, as the authors
# ---------------------------------------------------------------------------------------------------------------------


def weights_of(trainer, inputs):
    """The weights STEER gives the micro-batch ``inputs``, read off its gate."""
    scored = trainer.score_micro_batch(trainer.model, inputs)
    batch = trainer.completion_batch(inputs, scored)
    advantages = trainer.token_advantages(batch, [])
    gate, _ = trainer.part("steer").gate(batch, trainer.ratio(batch), advantages)
    return gate.weight.detach()


def test_the_weights_depend_on_the_micro_batch_and_a_fixed_layout_reproduces(toy_tokenizer, toy_trainer_of):
    trainer = toy_trainer_of("steer")
    inputs = make_grpo_batch(trainer.model, len(toy_tokenizer), batch=4, seed=11)
    whole = weights_of(trainer, inputs)
    torch.testing.assert_close(weights_of(trainer, inputs), whole, rtol=0, atol=0)  # the same layout: the same weights
    first = {key: value[:2] if hasattr(value, "dim") and value.dim() > 0 else value for key, value in inputs.items()}
    halves = weights_of(trainer, first)
    assert not torch.allclose(halves, whole[:2])  # μ_min and μ_max are the micro-batch's


# ---------------------------------------------------------------------------------------------------------------------
# Loss and every gradient against float64, for every loss type
# ---------------------------------------------------------------------------------------------------------------------

# Loss types with their options: the clipped ones with TRL's dual clip (delta) or the KL term, CISPO with an ε_max low
# enough to truncate the noisy ratios. Every loss type takes STEER's weight at token level.
LOSS_CASES = {
    "grpo": {"delta": 1.2},
    "bnpo": {"beta": 0.04},
    "dr_grpo": {"epsilon_high": 0.28},
    "dapo": {},
    "cispo": {"epsilon_high": 1.2},
    "sapo": {},
    "luspo": {},
    "vespo": {},
}
assert set(LOSS_CASES) == set(LOSS_TYPES)


def float64_steer_weights(log_probs, inputs, weight_min):
    """The exponential map's weights in float64 from the float64 log-probs, the rollout's and its entropy."""
    p = log_probs.detach().exp()
    p_old = inputs["old_per_token_logps"].double().exp()
    advantages = inputs["advantages"].double().unsqueeze(1)
    mu = (advantages / p_old * p * (1 - p) * (p.log() + inputs[OLD_ENTROPY_KEY].double())).abs()
    valid = inputs["completion_mask"].bool()
    kappa = -math.log(weight_min) / max(float(mu[valid].max()), 0.02)
    return torch.exp(-kappa * mu).clamp(weight_min, 1.0) * valid


@pytest.mark.parametrize("loss_type", LOSS_CASES)
def test_loss_and_every_gradient_equal_a_float64_steer_loss(toy_model_path, toy_tokenizer, toy_trainer_of, loss_type):
    ours = toy_trainer_of(
        "steer",
        loss_type=loss_type,
        num_iterations=2,  # the rollout's log-probs and entropy differ from this pass's
        **LOSS_CASES[loss_type],
    )
    inputs = make_grpo_batch(ours.model, len(toy_tokenizer), seed=list(LOSS_CASES).index(loss_type))
    inputs["advantages"] = torch.tensor([0.9, -0.5, 1.3, -1.6])  # no zero advantage: every row has a gradient
    our_loss, our_grads = loss_and_gradients(ours, inputs)

    reference = float64_model(toy_model_path)
    log_probs, _, _ = scores(reference, inputs)
    weights = float64_steer_weights(log_probs, inputs, ours.args.steer_weight_min)
    valid = inputs["completion_mask"].bool()
    assert weights[valid].min() == pytest.approx(0.8) and (weights[valid] > 0.95).any()  # the weights spread
    loss = float64_loss(loss_type, ours.args, log_probs, inputs, lambda surrogate: surrogate * weights)
    assert_step_is_float64(our_loss, our_grads, loss, reference)
    assert ours._metrics["train"]["steer/weight_mean"] == [pytest.approx(float(weights.sum() / valid.sum()), rel=1e-5)]

    # The comparison has power: without the weights the loss and the gradients differ.
    reference.zero_grad()
    unweighted = float64_loss(loss_type, ours.args, scores(reference, inputs)[0], inputs)
    unweighted.backward()
    assert abs(unweighted.item() - loss.item()) > 1e-4
    assert max((our_grads[n].double() - p.grad).abs().max().item() for n, p in reference.named_parameters()) > 1e-4


# The pair table's piece (tests/compose/test_pairs.py): its gate.


def pair_steer_gate(per_token_loss, log_probs, old_log_probs, entropy, old_entropy, advantages, mask, s):
    """STEER (arXiv:2510.10150) multiplies the loss by ``clamp(exp(−κ|Ω|), λ_min, 1)``,
    ``Ω = (A / p^old)·p(1 − p)·(log p + H^old)``, ``κ = −ln λ_min / max(max|Ω|, 0.02)`` over the valid tokens, without
    gradient."""
    p, p_old = log_probs.detach().exp(), old_log_probs.exp()
    mu = (advantages.expand_as(p) / p_old * p * (1 - p) * (p.log() + old_entropy)).abs()
    kappa = -math.log(s["steer_weight_min"]) / max(float(mu[mask.bool()].max()), 0.02)
    return per_token_loss * (torch.exp(-kappa * mu).clamp(s["steer_weight_min"], 1.0) * mask)


PAIR = PairReference(
    settings=dict(steer_weight_min=0.8),
    methods={"steer": PairMethod("stop-gradient gates", gate=pair_steer_gate)},
)
