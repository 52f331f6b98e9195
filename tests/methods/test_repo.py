"""REPO-D and REPO-R: per-token advantages, the entropy-bonus equivalence, the β controller, the trainer's loss and
gradients against trl.GRPOTrainer fed the paper's advantages. Checkpoints: tests/trainer/test_resume.py; accumulation
and cycle
timing: tests/trainer/test_accumulation.py; invalid config values: tests/trainer/test_bad_input.py."""

import json
import math

import pytest
import torch
from _reference.pairs import PairMethod, PairReference
from _support.grpo import (
    loss_and_gradients,
    make_grpo_batch,
    naive_entropy,
    naive_log_probs,
    set_sync,
    split_batch,
    varied_batch,
)
from _support.parity import TRL
from trl import GRPOConfig

from trl_entropy.methods.repo import REPOConfig, REPOController, repo_advantages


# ---------------------------------------------------------------------------------------------------------------------
# Config (invalid values: tests/trainer/test_bad_input.py)
# ---------------------------------------------------------------------------------------------------------------------


def test_config_defaults_are_the_papers_range_for_both_variants(tmp_path):
    for variant in ("R", "D"):  # REPO-R's range is the paper's; REPO-D's is ours
        config = REPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], repo_variant=variant)
        assert (config.repo_centering, config.repo_beta, config.repo_beta_min, config.repo_beta_max) == (
            "none",
            0.0,
            1e-4,
            0.05,
        )
        assert config.repo_entropy_target is None and config.repo_keep_advantage_sign is True
        assert config.entropy_target == GRPOConfig.entropy_target  # TRL's own field keeps TRL's default and meaning


# ---------------------------------------------------------------------------------------------------------------------
# Per-token advantages
# ---------------------------------------------------------------------------------------------------------------------

ADVANTAGES = [1.5, -0.5, 0.0]  # one per sequence
LOG_PROBS = [[-0.1, -6.0, -0.7], [-4.0, -0.2, -1.1], [-0.4, -5.0, -0.05]]
ENTROPIES = [[0.3, 1.2, 0.8], [2.0, 0.1, 0.9], [0.5, 3.0, 0.2]]


def spec_repo_advantage(advantage, log_prob, entropy, beta, variant, centering, keep_sign):
    """REPO (arXiv:2603.11682, §5.1, App. D.2; docs/repo.md): A' = A − β ζ; ζ = ℓ^s − c (D) or |A|(ℓ^s − c) (R),
    c = 0 or −H; REPO-R written as A(1 − β sign(A)(ℓ^s − c)) with the factor clamped at 0 when the sign is kept."""
    centred = log_prob - (0.0 if centering == "none" else -entropy)
    if variant == "D":
        return advantage - beta * centred
    sign = (advantage > 0) - (advantage < 0)
    factor = 1 - beta * sign * centred
    return advantage * (max(factor, 0.0) if keep_sign else factor)


@pytest.mark.parametrize("variant", ["D", "R"])
@pytest.mark.parametrize("centering", ["none", "entropy"])
@pytest.mark.parametrize("beta", [0.3, -0.2])
@pytest.mark.parametrize("keep_sign", [True, False])
def test_repo_advantages_follow_the_formula(variant, centering, beta, keep_sign):
    expected = [
        [spec_repo_advantage(a, lp, h, beta, variant, centering, keep_sign) for lp, h in zip(lps, hs, strict=True)]
        for a, lps, hs in zip(ADVANTAGES, LOG_PROBS, ENTROPIES, strict=True)
    ]
    result = repo_advantages(
        torch.tensor(ADVANTAGES, dtype=torch.float64).unsqueeze(1),
        torch.tensor(LOG_PROBS, dtype=torch.float64),
        torch.tensor(ENTROPIES, dtype=torch.float64),
        beta,
        variant,
        centering,
        keep_sign,
    )
    assert result.shape == (3, 3)
    torch.testing.assert_close(result, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_repo_advantages_signs_on_explicit_numbers():
    advantages = torch.tensor([[2.0], [-2.0]], dtype=torch.float64)
    log_probs = torch.tensor([[-3.0, -0.1], [-3.0, -0.1]], dtype=torch.float64)
    # REPO-D, β = 0.1: A − 0.1 ℓ, a rare token (ℓ = −3) gains 0.3, a common one 0.01, whatever the sign of A.
    expected_d = [[2.0 + 0.3, 2.0 + 0.01], [-2.0 + 0.3, -2.0 + 0.01]]
    torch.testing.assert_close(
        repo_advantages(advantages, log_probs, None, 0.1, "D"), torch.tensor(expected_d).double()
    )
    # REPO-R, β = 0.1: A (1 − 0.1 sign(A) ℓ): the rare correct token is boosted (2 → 2.6), the rare incorrect one is
    # penalised less (−2 → −1.4).
    expected_r = [[2.0 * 1.3, 2.0 * 1.01], [-2.0 * 0.7, -2.0 * 0.99]]
    torch.testing.assert_close(
        repo_advantages(advantages, log_probs, None, 0.1, "R"), torch.tensor(expected_r).double()
    )
    # REPO-R, β = 0.5: the rare incorrect token's factor 1 + 0.5·(−3) = −0.5 would turn its penalty into a reward;
    # kept sign: 0; unclamped: −2 · −0.5 = +1.
    expected_kept = [[2.0 * 2.5, 2.0 * 1.05], [0.0, -2.0 * 0.95]]
    torch.testing.assert_close(
        repo_advantages(advantages, log_probs, None, 0.5, "R"), torch.tensor(expected_kept).double()
    )
    expected_free = [[2.0 * 2.5, 2.0 * 1.05], [1.0, -2.0 * 0.95]]
    torch.testing.assert_close(
        repo_advantages(advantages, log_probs, None, 0.5, "R", keep_sign=False), torch.tensor(expected_free).double()
    )
    # REPO-R with entropy centring, H = 1: ℓ + H is −2 for the rare token and +0.9 for the common one, so the common
    # correct token is now damped (2 → 1.82) and the common incorrect one penalised more (−2 → −2.18).
    entropy = torch.ones(2, 2, dtype=torch.float64)
    expected_c = [[2.0 + 0.2 * 2.0, 2.0 - 0.09 * 2.0], [-2.0 + 0.2 * 2.0, -2.0 - 0.09 * 2.0]]
    torch.testing.assert_close(
        repo_advantages(advantages, log_probs, entropy, 0.1, "R", "entropy"), torch.tensor(expected_c).double()
    )


def test_repo_advantages_carry_no_gradient_and_need_entropy_for_centring():
    log_probs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    entropy = torch.tensor([[0.5, 0.7]], requires_grad=True)
    result = repo_advantages(torch.tensor([[1.0]]), log_probs, entropy, 0.2, "D", "entropy")
    assert not result.requires_grad
    with pytest.raises(ValueError, match="entropy"):
        repo_advantages(torch.tensor([[1.0]]), log_probs, None, 0.2, "D", "entropy")
    with pytest.raises(ValueError, match="variant"):
        repo_advantages(torch.tensor([[1.0]]), log_probs, None, 0.2, "X")
    with pytest.raises(ValueError, match="centering"):
        repo_advantages(torch.tensor([[1.0]]), log_probs, None, 0.2, "D", "zero")


@pytest.mark.parametrize("centering", ["none", "entropy"])
def test_repo_d_expected_gradient_is_grpo_plus_entropy_bonus(centering):
    """App. A.7 on a tabular softmax: E[(A − β ζ) ∇ℓ] = ∇(E[A] + β H(π)), ζ = ℓ^s − c."""
    theta = torch.tensor([1.2, -0.3, 0.5, -1.5, 0.0, 2.0], dtype=torch.float64)
    action_advantages = torch.tensor([0.8, -1.0, 0.3, 1.5, -0.2, -0.6], dtype=torch.float64)
    beta, samples = 0.5, 400_000

    def objective(parameters, bonus):
        probabilities = torch.softmax(parameters, -1)
        entropy = -(probabilities * torch.log_softmax(parameters, -1)).sum()
        return (probabilities * action_advantages).sum() + bonus * entropy

    def exact_gradient(bonus):
        parameters = theta.clone().requires_grad_(True)
        return torch.autograd.grad(objective(parameters, bonus), parameters)[0]

    generator = torch.Generator().manual_seed(0)
    probabilities = torch.softmax(theta, -1)
    entropy = -(probabilities * probabilities.log()).sum()
    actions = torch.multinomial(probabilities, samples, replacement=True, generator=generator)

    def estimate(bonus):
        parameters = theta.clone().requires_grad_(True)
        log_probs = torch.log_softmax(parameters, -1)[actions].unsqueeze(1)  # ℓ of each sampled action, (N, 1)
        advantages = repo_advantages(
            action_advantages[actions].unsqueeze(1),
            log_probs.detach(),
            entropy.expand(samples, 1),
            bonus,
            "D",
            centering,
        )
        surrogate = (advantages * log_probs).mean()  # REINFORCE: ∇ = mean of A'_i ∇ℓ_i
        gradient = torch.autograd.grad(surrogate, parameters)[0]
        # Per-sample gradients A'_i (e_{a_i} − π) for the standard errors.
        per_sample = advantages * (torch.nn.functional.one_hot(actions, len(theta)).double() - probabilities)
        torch.testing.assert_close(gradient, per_sample.mean(0), rtol=1e-10, atol=1e-12)
        return gradient, per_sample.std(0) / math.sqrt(samples)

    exact = exact_gradient(beta)
    gradient, standard_error = estimate(beta)
    assert torch.all((gradient - exact).abs() <= 5 * standard_error), ((gradient - exact) / standard_error).tolist()
    # The test has power: the entropy term is many standard errors away, and the plain GRPO estimate misses it.
    assert torch.max((exact - exact_gradient(0.0)).abs() / standard_error) > 20
    grpo_gradient, _ = estimate(0.0)
    assert torch.max((grpo_gradient - exact).abs() / standard_error) > 20


# ---------------------------------------------------------------------------------------------------------------------
# Controller
# ---------------------------------------------------------------------------------------------------------------------


def spec_beta_update(beta, entropy, target, beta_min, beta_max):
    """REPO's controller (arXiv:2603.11682, §5.1; docs/repo.md), written out: d = +1 below the target, −1 above, 0
    on it (no change). β doubles if sign(β) = d; otherwise it halves, and becomes d·β_min if then |β| < β_min.
    Finally |β| is capped at β_max."""
    d = 1 if entropy < target else (-1 if entropy > target else 0)
    if d == 0:
        return beta
    if (beta > 0) - (beta < 0) == d:
        beta = 2 * beta
    else:
        beta = beta / 2
        if abs(beta) < beta_min:
            beta = d * beta_min
    return max(-beta_max, min(beta, beta_max))


@pytest.mark.parametrize("sign", [1, -1], ids=["entropy_below_target", "entropy_above_target"])
def test_controller_trajectory_from_zero_doubling_cap_halving_and_flip(sign):
    target = 1.0
    # Ten cycles pushing one way, ten pushing the other, then one on target.
    entropies = [target - 0.5 * sign] * 11 + [target + 0.5 * sign] * 10 + [target]
    by_hand = (
        [1e-4, 2e-4, 4e-4, 8e-4, 1.6e-3, 3.2e-3, 6.4e-3, 1.28e-2, 2.56e-2]  # from β = 0: d·β_min, then doubling
        + [0.05, 0.05]  # 5.12e-2 and 0.1 capped at β_max
        + [0.025, 0.0125, 6.25e-3, 3.125e-3, 1.5625e-3, 7.8125e-4, 3.90625e-4, 1.953125e-4]  # halving
        + [-1e-4]  # 9.765625e-5 < β_min: the sign flips to d·β_min
        + [-2e-4]  # doubling the other way
        + [-2e-4]  # on target: unchanged
    )
    controller = REPOController(beta=0.0, beta_min=1e-4, beta_max=0.05, entropy_target=target)
    betas, spec_beta = [], 0.0
    for step, entropy in enumerate(entropies, start=1):
        controller.update(entropy, step)
        betas.append(controller.beta)
        spec_beta = spec_beta_update(spec_beta, entropy, target, 1e-4, 0.05)
        assert controller.beta == pytest.approx(spec_beta, rel=1e-12), step
        assert controller.metrics() == {"repo/beta": controller.beta, "repo/entropy_target": target}
    assert betas == pytest.approx([sign * beta for beta in by_hand], rel=1e-12)


def test_controller_measures_its_target_on_the_first_cycle_and_round_trips():
    controller = REPOController(beta=0.0, beta_min=1e-4, beta_max=0.05)
    assert math.isnan(controller.metrics()["repo/entropy_target"])
    controller.update(0.8, 1)  # measures H* = 0.8; d = 0: β stays 0
    assert (controller.beta, controller.entropy_target) == (0.0, 0.8)
    controller.update(0.9, 2)  # above the target: −β_min
    assert controller.beta == -1e-4
    restored = REPOController(beta=0.0, beta_min=1e-4, beta_max=0.05)
    restored.load_state_dict(json.loads(json.dumps(controller.state_dict())))
    assert restored.state_dict() == controller.state_dict() == {"beta": -1e-4, "entropy_target": 0.8}
    for entropy in (0.9, 0.7):
        controller.update(entropy, 3)
        restored.update(entropy, 3)
        assert restored.beta == controller.beta


# ---------------------------------------------------------------------------------------------------------------------
# Trainer: loss and gradients against trl.GRPOTrainer fed the paper's advantages, the first cycle's target
# ---------------------------------------------------------------------------------------------------------------------


def spec_advantages(model, inputs, beta, variant, centering, keep_sign, sampled_log_probs=None):
    """The paper's A'_t in float64, ℓ^s being this forward pass's log-prob (the float64 model's) unless given."""
    if sampled_log_probs is None:
        sampled_log_probs = naive_log_probs(model, inputs)
    entropy = naive_entropy(model, inputs)
    rows = []
    for i, advantage in enumerate(inputs["advantages"].double().tolist()):
        rows.append(
            [
                spec_repo_advantage(advantage, lp, h, beta, variant, centering, keep_sign)
                for lp, h in zip(sampled_log_probs[i].tolist(), entropy[i].tolist(), strict=True)
            ]
        )
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize(
    "variant, centering, beta, keep_sign, loss_type, level",
    [
        ("D", "none", 0.04, True, "grpo", "token"),
        ("D", "entropy", -0.05, True, "dapo", "token"),
        ("R", "none", 0.5, True, "dapo", "sequence"),
        ("R", "none", -0.6, True, "grpo", "token"),
        ("R", "none", 0.45, False, "bnpo", "token"),
        ("R", "entropy", 4.0, True, "grpo", "token"),  # ℓ + H is small on the toy model: a large β clamps
    ],
)
def test_loss_and_gradients_equal_grpo_trainer_with_the_specs_advantages(
    toy_tokenizer, variant, centering, beta, keep_sign, loss_type, level, toy_trainer_of
):
    options = dict(loss_type=loss_type, importance_sampling_level=level)
    trl_trainer = toy_trainer_of(TRL, "trl", **options)
    ours = toy_trainer_of(
        "repo_r",
        "ours",
        repo_variant=variant,
        repo_centering=centering,
        repo_beta=beta,
        repo_beta_max=5.0,
        repo_keep_advantage_sign=keep_sign,
        **options,
    )
    inputs = make_grpo_batch(trl_trainer.model, len(toy_tokenizer), seed=7)  # rollout log-probs = current + noise
    expected = spec_advantages(trl_trainer.model, inputs, beta, variant, centering, keep_sign)

    set_sync(ours, False)  # within a cycle: β stays at its initial value
    our_loss, our_grads = loss_and_gradients(ours, inputs)
    trl_loss, trl_grads = loss_and_gradients(trl_trainer, dict(inputs, advantages=expected.float()))
    torch.testing.assert_close(our_loss, trl_loss, rtol=1e-5, atol=1e-7)
    assert set(our_grads) == set(trl_grads)
    for name in trl_grads:
        torch.testing.assert_close(our_grads[name], trl_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    assert ours.controllers["repo"].beta == beta

    # The comparison has power: GRPO's own advantages, ℓ^s taken from the rollout, and (REPO-R) the other choice of
    # the sign clamp each give another loss.
    others = [
        inputs["advantages"].double().unsqueeze(1).expand_as(expected),
        spec_advantages(
            trl_trainer.model, inputs, beta, variant, centering, keep_sign, inputs["old_per_token_logps"].double()
        ),
    ]
    if variant == "R":
        others.append(spec_advantages(trl_trainer.model, inputs, beta, variant, centering, not keep_sign))
    for other in others:
        other_loss, _ = loss_and_gradients(trl_trainer, dict(inputs, advantages=other.float()))
        assert abs(other_loss.item() - our_loss.item()) > 1e-4


def test_target_is_the_first_cycles_mean_entropy(toy_tokenizer, toy_trainer_of):
    trainer = toy_trainer_of("repo_r", accumulation=2, repo_beta=0.04)
    inputs = varied_batch(trainer.model, len(toy_tokenizer), seed=0)
    first, second = split_batch(inputs)
    set_sync(trainer, False)
    trainer.compute_loss(trainer.model, first)
    assert trainer.controllers["repo"].entropy_target is None  # mid-cycle: nothing measured yet
    set_sync(trainer, True)
    trainer.compute_loss(trainer.model, second)
    entropy, mask = naive_entropy(trainer.model, inputs), inputs["completion_mask"].double()
    expected = ((entropy * mask).sum() / mask.sum()).item()  # token-weighted over the whole cycle
    controller = trainer.controllers["repo"]
    assert controller.entropy_target == pytest.approx(expected, rel=1e-5)
    assert controller.beta == 0.04  # H̄ = H* on the first cycle: d = 0
    assert trainer._metrics["train"]["repo/entropy_target"] == [controller.entropy_target]
    assert trainer._metrics["train"]["repo/beta"] == [0.04]


# The pair table's piece (tests/compose/test_pairs.py): the per-token advantage of each variant.


def pair_repo_r_advantages(advantages, log_probs, entropy, s):
    """REPO-R (arXiv:2603.11682, §5.1; β at its initial value, no centring): ``A·max(0, 1 − β·sign(A)·ℓ)``."""
    return advantages * (1 - s["repo_beta"] * advantages.sign() * log_probs).clamp(min=0)


def pair_repo_d_advantages(advantages, log_probs, entropy, s):
    """REPO-D (arXiv:2603.11682, §5.1; β at its initial value, no centring): ``A − β·ℓ``."""
    return advantages - s["repo_beta"] * log_probs


PAIR = PairReference(
    settings=dict(repo_beta=0.5, repo_beta_max=1.0),
    methods={
        "repo_r": PairMethod("per-token advantage", token_advantages=pair_repo_r_advantages),
        "repo_d": PairMethod("per-token advantage", token_advantages=pair_repo_d_advantages),
    },
)
