"""REPO-D and REPO-R: per-token advantages, the entropy-bonus equivalence, the β controller, the trainer's loss against
trl.GRPOTrainer, checkpoints, gradient accumulation and an end-to-end run on the toy task."""

import json
import math
import os

import pytest
import torch
from conftest import (
    build_trainer,
    loss_and_gradients,
    make_grpo_batch,
    naive_entropy,
    set_sync,
    split_batch,
    train_toy,
    varied_batch,
)
from trl import GRPOConfig, GRPOTrainer

from trl_entropy.repo import (
    REPOConfig,
    REPOController,
    REPOTrainer,
    repo_advantages,
    repo_controller_step,
)


# ---------------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------------


def make_config(tmp_path, **options):
    return REPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], **options)


def test_config_defaults_resolve_from_the_variant(tmp_path):
    config = make_config(tmp_path)
    assert (config.repo_variant, config.repo_centering, config.repo_beta, config.entropy_target) == (
        "R",
        "none",
        0,
        None,
    )
    assert (config.repo_beta_step, config.repo_beta_max) == (1e-2, 0.5)
    config = make_config(tmp_path, repo_variant="D")
    assert (config.repo_beta_step, config.repo_beta_max) == (1e-3, 0.05)
    config = make_config(tmp_path, repo_variant="D", repo_beta_step=0.2, repo_beta_max=0.7, repo_beta=-0.7)
    assert (config.repo_beta_step, config.repo_beta_max, config.repo_beta) == (0.2, 0.7, -0.7)


@pytest.mark.parametrize(
    "options, field_name",
    [
        ({"repo_variant": "X"}, "repo_variant"),
        ({"repo_variant": "d"}, "repo_variant"),
        ({"repo_centering": "mean"}, "repo_centering"),
        ({"repo_beta_step": 0.0}, "repo_beta_step"),
        ({"repo_beta_step": -0.1}, "repo_beta_step"),
        ({"repo_beta_step": math.inf}, "repo_beta_step"),
        ({"repo_beta_max": 0.0}, "repo_beta_max"),
        ({"repo_beta_max": math.nan}, "repo_beta_max"),
        ({"repo_beta": 0.6}, "repo_beta"),  # REPO-R's default maximum is 0.5
        ({"repo_beta": -0.06, "repo_variant": "D"}, "repo_beta"),  # REPO-D's default maximum is 0.05
        ({"repo_beta": math.nan}, "repo_beta"),
        ({"entropy_target": 0.0}, "entropy_target"),
        ({"entropy_target": -1.0}, "entropy_target"),
        ({"entropy_target": math.inf}, "entropy_target"),
        ({"entropy_coef": 0.01}, "entropy_coef"),
        ({"use_adaptive_entropy": True}, "use_adaptive_entropy"),
        ({"loss_type": "cispo"}, "loss_type"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(tmp_path, options, field_name):
    with pytest.raises(ValueError, match=field_name):
        make_config(tmp_path, **options)


# ---------------------------------------------------------------------------------------------------------------------
# Per-token advantages
# ---------------------------------------------------------------------------------------------------------------------

ADVANTAGES = [1.5, -0.5, 0.0]  # one per sequence
LOG_PROBS = [[-0.1, -2.0, -0.7], [-3.0, -0.2, -1.1], [-0.4, -5.0, -0.05]]
ENTROPIES = [[0.3, 1.2, 0.8], [2.0, 0.1, 0.9], [0.5, 3.0, 0.2]]


@pytest.mark.parametrize("variant", ["D", "R"])
@pytest.mark.parametrize("centering", ["none", "entropy"])
@pytest.mark.parametrize("beta", [0.3, -0.2])
def test_repo_advantages_follow_the_formula(variant, centering, beta):
    expected = []
    for advantage, log_probs, entropies in zip(ADVANTAGES, LOG_PROBS, ENTROPIES, strict=True):
        row = []
        for log_prob, entropy in zip(log_probs, entropies, strict=True):
            centre = 0.0 if centering == "none" else -entropy  # c_t
            zeta = (log_prob - centre) if variant == "D" else abs(advantage) * (log_prob - centre)
            row.append(advantage - beta * zeta)
        expected.append(row)
    result = repo_advantages(
        torch.tensor(ADVANTAGES, dtype=torch.float64).unsqueeze(1),
        torch.tensor(LOG_PROBS, dtype=torch.float64),
        torch.tensor(ENTROPIES, dtype=torch.float64),
        beta,
        variant,
        centering,
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


def test_controller_step_function_on_explicit_cases():
    # below target: d = +1; β > 0 keeps its sign
    assert repo_controller_step(0.02, 0.9, 1.0, 0.01, 0.05) == pytest.approx(0.03)
    # below target with β < 0: flip to +0.02, then + 0.01
    assert repo_controller_step(-0.02, 0.9, 1.0, 0.01, 0.05) == pytest.approx(0.03)
    # above target with β > 0: flip to −0.02, then − 0.01
    assert repo_controller_step(0.02, 1.1, 1.0, 0.01, 0.05) == pytest.approx(-0.03)
    # above target with β = 0: nothing to flip, −δ
    assert repo_controller_step(0.0, 1.1, 1.0, 0.01, 0.05) == pytest.approx(-0.01)
    # on target: d = 0, β unchanged (no flip)
    assert repo_controller_step(-0.02, 1.0, 1.0, 0.01, 0.05) == -0.02
    # clipping at ±β_max
    assert repo_controller_step(0.045, 0.5, 1.0, 0.01, 0.05) == pytest.approx(0.05)
    assert repo_controller_step(0.045, 1.5, 1.0, 0.01, 0.05) == pytest.approx(-0.05)


def test_controller_trajectory_on_a_scripted_entropy_sequence():
    controller = REPOController(beta=0.005, beta_step=0.01, beta_max=0.05)
    entropies = [1.0, 0.9, 1.1, 0.9, 1.2, 1.3, 1.4, 1.0, 0.99, 1.01]
    # Step 1 measures H* = 1.0 (d = 0). Then, by hand: +δ; flip and −δ; flip and +δ; flip and −δ; −δ clipped to
    # −0.05; stays clipped; d = 0; flip and +δ clipped; flip and −δ clipped.
    expected = [0.005, 0.015, -0.025, 0.035, -0.045, -0.05, -0.05, -0.05, 0.05, -0.05]
    betas = []
    for step, entropy in enumerate(entropies, start=1):
        controller.update(entropy, step)
        betas.append(controller.beta)
        assert controller.metrics() == {"repo/beta": controller.beta, "repo/entropy_target": 1.0}
    assert betas == pytest.approx(expected, abs=1e-12)
    assert controller.state_dict() == {"beta": betas[-1], "entropy_target": 1.0, "last_step": 10}


def test_controller_with_a_given_target_moves_on_the_first_step():
    controller = REPOController(beta=0.0, beta_step=0.01, beta_max=0.05, entropy_target=2.0)
    controller.update(1.0, 1)  # below the given target: +δ
    assert (controller.beta, controller.entropy_target) == (pytest.approx(0.01), 2.0)
    controller.update(3.0, 2)  # above: flip to −0.01, then −δ
    assert controller.beta == pytest.approx(-0.02)
    restored = REPOController(beta=0.0, beta_step=0.01, beta_max=0.05)
    restored.load_state_dict(json.loads(json.dumps(controller.state_dict())))
    assert restored.state_dict() == controller.state_dict()


# ---------------------------------------------------------------------------------------------------------------------
# Trainer: loss against trl.GRPOTrainer, the first-step target, gradient accumulation
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "variant, centering, beta, loss_type, level",
    [
        ("D", "none", 0.04, "grpo", "token"),
        ("D", "entropy", -0.05, "dapo", "token"),
        ("R", "none", 0.3, "dapo", "sequence"),
        ("R", "entropy", 0.45, "bnpo", "token"),
    ],
)
def test_loss_equals_grpo_trainer_with_repo_advantages(
    toy_model_path, toy_tokenizer, tmp_path, variant, centering, beta, loss_type, level
):
    options = dict(loss_type=loss_type, importance_sampling_level=level)
    trl_trainer = build_trainer(GRPOTrainer, GRPOConfig, toy_model_path, toy_tokenizer, tmp_path / "trl", **options)
    ours = build_trainer(
        REPOTrainer,
        REPOConfig,
        toy_model_path,
        toy_tokenizer,
        tmp_path / "ours",
        repo_variant=variant,
        repo_centering=centering,
        repo_beta=beta,
        **options,
    )
    inputs = make_grpo_batch(trl_trainer.model, len(toy_tokenizer), seed=7)
    # The SPEC formula, written out: A'_t = A − β ζ_t with ℓ^s = the rollout log-probs, c_t = 0 or −H_t.
    advantage = inputs["advantages"].double().unsqueeze(1)
    centre = -naive_entropy(trl_trainer.model, inputs) if centering == "entropy" else 0.0
    centred = inputs["old_per_token_logps"].double() - centre
    zeta = centred if variant == "D" else advantage.abs() * centred
    trl_inputs = dict(inputs, advantages=(advantage - beta * zeta).float())

    set_sync(ours, False)  # within an accumulation window: β stays at its initial value
    our_loss, our_grads = loss_and_gradients(ours, inputs)
    trl_loss, trl_grads = loss_and_gradients(trl_trainer, trl_inputs)
    torch.testing.assert_close(our_loss, trl_loss, rtol=1e-5, atol=1e-7)
    assert set(our_grads) == set(trl_grads)
    for name in trl_grads:
        torch.testing.assert_close(our_grads[name], trl_grads[name], rtol=1e-4, atol=1e-7, msg=name)
    # The comparison has power: GRPO's own advantages give another loss.
    plain_loss, _ = loss_and_gradients(trl_trainer, inputs)
    assert abs(plain_loss.item() - our_loss.item()) > 1e-4
    assert ours.controllers["repo"].beta == beta


def test_target_is_the_first_optimizer_steps_mean_entropy(toy_model_path, toy_tokenizer, tmp_path):
    trainer = build_trainer(
        REPOTrainer, REPOConfig, toy_model_path, toy_tokenizer, tmp_path, accumulation=2, repo_beta=0.1
    )
    inputs = varied_batch(trainer.model, len(toy_tokenizer), seed=0)
    first, second = split_batch(inputs)
    set_sync(trainer, False)
    trainer.compute_loss(trainer.model, first)
    assert trainer.controllers["repo"].entropy_target is None  # mid-window: nothing measured yet
    set_sync(trainer, True)
    trainer.compute_loss(trainer.model, second)
    entropy, mask = naive_entropy(trainer.model, inputs), inputs["completion_mask"].double()
    expected = ((entropy * mask).sum() / mask.sum()).item()  # token-weighted over the whole window
    controller = trainer.controllers["repo"]
    assert controller.entropy_target == pytest.approx(expected, rel=1e-5)
    assert controller.beta == 0.1  # H̄ = H* on the first step: d = 0
    assert trainer._metrics["train"]["repo/entropy_target"] == [controller.entropy_target]
    assert trainer._metrics["train"]["repo/beta"] == [0.1]


def test_accumulation_of_two_half_batches_gives_the_same_trajectory(toy_model_path, toy_tokenizer, tmp_path):
    options = dict(repo_variant="D", repo_beta_step=0.01)
    whole = build_trainer(REPOTrainer, REPOConfig, toy_model_path, toy_tokenizer, tmp_path / "a", 1, **options)
    halves = build_trainer(REPOTrainer, REPOConfig, toy_model_path, toy_tokenizer, tmp_path / "b", 2, **options)
    trajectory = []
    for seed in range(5):
        inputs = varied_batch(whole.model, len(toy_tokenizer), seed=seed)
        set_sync(whole, True)
        whole.compute_loss(whole.model, inputs)
        for sync, part in zip((False, True), split_batch(inputs), strict=True):
            set_sync(halves, sync)
            halves.compute_loss(halves.model, part)
        a, b = whole.controllers["repo"], halves.controllers["repo"]
        assert b.entropy_target == pytest.approx(a.entropy_target, rel=1e-6)
        assert b.beta == pytest.approx(a.beta, abs=1e-12)
        trajectory.append(a.beta)
    assert len(set(trajectory)) > 2, trajectory  # the controller moved


# ---------------------------------------------------------------------------------------------------------------------
# End to end: training on the toy task, checkpoint and resume
# ---------------------------------------------------------------------------------------------------------------------


def test_train_checkpoint_and_resume(warm_toy_policy_path, tmp_path):
    options = dict(repo_variant="R", repo_beta=0.02, repo_beta_step=0.05)
    trainer, _, logs = train_toy(REPOTrainer, REPOConfig, warm_toy_policy_path, tmp_path, "repo/beta", **options)
    assert sorted(logs) == [1, 2, 3, 4]
    target = logs[1]["repo/entropy_target"]
    assert 0 < target < math.log(len(trainer.processing_class))
    # One micro-batch per optimizer step: the target is step 1's logged mean entropy.
    assert target == pytest.approx(logs[1]["entropy"], rel=1e-6)
    assert logs[1]["repo/beta"] == pytest.approx(0.02)
    beta = 0.02
    for step in (1, 2, 3, 4):
        assert logs[step]["repo/entropy_target"] == target
        entropy = logs[step]["entropy"]
        d = 1 if entropy < target else (-1 if entropy > target else 0)
        beta = beta if step == 1 else min(max((-beta if beta * d < 0 else beta) + 0.05 * d, -0.5), 0.5)
        assert logs[step]["repo/beta"] == pytest.approx(beta, abs=1e-9), step
    assert math.isfinite(logs[4]["entropy/cov_logp_adv"])

    checkpoint = os.path.join(tmp_path, "checkpoint-2")
    with open(os.path.join(checkpoint, "trl_entropy_controllers.json")) as file:
        saved = json.load(file)
    assert saved == {"repo": {"beta": pytest.approx(logs[2]["repo/beta"]), "entropy_target": target, "last_step": 2}}

    resumed, recorder, resumed_logs = train_toy(
        REPOTrainer, REPOConfig, warm_toy_policy_path, tmp_path / "resumed", "repo/beta", checkpoint, **options
    )
    assert recorder.state == saved  # restored exactly, before the first resumed step
    assert sorted(resumed_logs) == [1, 2, 3, 4]  # steps 1-2 come from the checkpoint's trainer state
    entropy = resumed_logs[3]["entropy"]
    d = 1 if entropy < target else -1
    beta = saved["repo"]["beta"]
    expected = min(max((-beta if beta * d < 0 else beta) + 0.05 * d, -0.5), 0.5)
    assert resumed_logs[3]["repo/entropy_target"] == target  # not measured again
    assert resumed_logs[3]["repo/beta"] == pytest.approx(expected, abs=1e-9)
    assert resumed.controllers["repo"].last_step == 4
