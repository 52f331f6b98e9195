"""AEnt: config, the coefficient controller, the loss and gradients against a float64 reference (TRL's
high-entropy filter included) and an end-to-end run on the toy task. Checkpoints: tests/trainer/test_resume.py;
accumulation
and cycle timing: tests/trainer/test_accumulation.py; invalid config values: tests/trainer/test_bad_input.py."""

import json
import math

import pytest
import torch
from _reference.combined_reference import weighted_mean
from _reference.float64_policy import completion_logits, float64_model
from _reference.pairs import PairMethod, PairReference
from _support.checkpoint_files import resume_from_saved
from _support.grpo import loss_and_gradients, make_grpo_batch, set_sync, toy_config
from _support.parity import TRL

from trl_entropy.methods.aent import AEntConfig, AEntController, AEntTrainer, aent_coefficient_step
from trl_entropy.toy import build_toy_dataset, toy_reward


# ---------------------------------------------------------------------------------------------------------------------
# References written out from the paper (arXiv:2509.03493, eq. 4.1; docs/aent.md)
# ---------------------------------------------------------------------------------------------------------------------


def reference_step(coef, entropy, low, high, lr, coef_min, coef_max):
    """Eq. 4.1: rise by α(H_low − H̄) below the band, fall by α(H̄ − H_high) above it, hold inside; then the box."""
    if entropy < low:
        coef = coef + lr * (low - entropy)
    elif entropy > high:
        coef = coef - lr * (entropy - high)
    return min(max(coef, coef_min), coef_max)


def reference_clamped_entropy(logits, clamp_fraction):
    """H^c per position in the logits' dtype: drop the floor(p·V) smallest logits, H^c = lse_kept(z) − Σ_kept π̃ z."""
    vocab = logits.size(-1)
    dropped = math.floor(clamp_fraction * vocab)
    kept_index = logits.detach().topk(vocab - dropped, dim=-1).indices  # the V − k largest logits
    kept = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, kept_index, True)
    kept_logits = logits.masked_fill(~kept, float("-inf"))
    renormalised = torch.softmax(kept_logits, dim=-1)  # exactly 0 on the dropped entries
    return torch.logsumexp(kept_logits, dim=-1) - (renormalised * logits).sum(-1)


def reference_scores(model64, inputs, temperature, clamp_fraction):
    """(B, T) float64 clamped entropy of the completion positions, from the full logits of a float64 model."""
    return reference_clamped_entropy(completion_logits(model64, inputs) / temperature, clamp_fraction)


def token_mean(values, mask):
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum()


# ---------------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------------


def test_config_defaults_are_the_reference_values():
    config = toy_config(AEntConfig)
    assert config.aent_clamp_fraction == 0.3
    assert config.aent_coef_init == 2e-4
    assert config.aent_entropy_low == 0.05
    assert config.aent_entropy_high == 0.23
    assert config.aent_coef_lr == 1e-3
    assert config.aent_coef_min == 1e-5
    assert config.aent_coef_max == 3e-3
    assert config.aent_warmup_steps == 0
    assert config.aent_adaptive is True
    assert config.entropy_coef == 0.0 and config.use_adaptive_entropy is False
    for name, spec in AEntConfig.__dataclass_fields__.items():
        if name.startswith("aent_"):
            assert spec.metadata.get("help"), f"{name} has no help"


def test_config_accepts_edge_values():
    # p = 0 (full entropy), an empty band, a degenerate box, α = 0; λ_0 outside the box with a fixed coefficient.
    toy_config(AEntConfig, aent_clamp_fraction=0.0, aent_entropy_low=0.1, aent_entropy_high=0.1, aent_coef_lr=0.0)
    toy_config(AEntConfig, aent_coef_min=1e-3, aent_coef_max=1e-3, aent_coef_init=1e-3)
    toy_config(AEntConfig, aent_adaptive=False, aent_coef_init=0.05)


# ---------------------------------------------------------------------------------------------------------------------
# The controller
# ---------------------------------------------------------------------------------------------------------------------

BAND = dict(low=0.05, high=0.23, lr=1e-3, coef_min=1e-5, coef_max=3e-3)


@pytest.mark.parametrize(
    "coef, entropy, expected",
    [
        (1e-3, 0.01, 1e-3 + 1e-3 * 0.04),  # below the band: rises by α(H_low − H̄)
        (1e-3, 0.5, 1e-3 - 1e-3 * 0.27),  # above: falls by α(H̄ − H_high)
        (1e-3, 0.1, 1e-3),  # inside: holds
        (1e-3, 0.05, 1e-3),  # on the edges: holds
        (1e-3, 0.23, 1e-3),
        (1e-3, 3.0, 1e-5),  # falls below λ_min: clipped to it
        (2.99e-3, 0.0, 3e-3),  # rises above λ_max: clipped to it
    ],
)
def test_coefficient_step(coef, entropy, expected):
    assert aent_coefficient_step(coef, entropy, **BAND) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert aent_coefficient_step(coef, entropy, **BAND) == pytest.approx(reference_step(coef, entropy, **BAND))


def test_controller_follows_the_formula_on_a_scripted_sequence():
    entropies = [0.01, 0.5, 0.02, 0.0, 0.1, 0.6, 2.0, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0, 0.04, 0.15, 0.3]
    warmup, options = 2, dict(low=0.05, high=0.23, lr=2e-2, coef_min=1e-4, coef_max=4e-3)
    controller = AEntController(coef=2e-3, warmup_steps=warmup, **options)
    assert controller.name == "aent" and controller.statistic == "clamped_entropy"
    expected, trajectory, expected_trajectory = 2e-3, [], []
    for step, entropy in enumerate(entropies, start=1):
        before = controller.value
        controller.update(entropy, step)
        if step > warmup:
            expected = reference_step(expected, entropy, **options)
        trajectory.append(controller.value)
        expected_trajectory.append(expected)
        assert controller.metrics() == {"aent/coef": controller.value}
        # Direction: held during warm-up and inside the band, else up below it / down above it unless at the box.
        if step <= warmup or options["low"] <= entropy <= options["high"]:
            assert controller.value == before
        elif entropy < options["low"]:
            assert controller.value > before or controller.value == options["coef_max"]
        else:
            assert controller.value < before or controller.value == options["coef_min"]
        assert options["coef_min"] <= controller.value <= options["coef_max"]
    assert trajectory == pytest.approx(expected_trajectory, rel=1e-12)
    assert trajectory[:warmup] == [2e-3] * warmup
    assert min(trajectory) == options["coef_min"] and max(trajectory) == options["coef_max"]  # both ends reached


def test_controller_fixed_when_not_adaptive():
    controller = AEntController(coef=0.05, adaptive=False, **BAND)
    for step, entropy in enumerate([0.0, 5.0, 0.1], start=1):
        controller.update(entropy, step)
        assert controller.value == 0.05


def test_controller_state_round_trip():
    first = AEntController(coef=1e-3, **BAND)
    for step, entropy in enumerate([0.01, 0.02, 0.4], start=1):
        first.update(entropy, step)
    state = json.loads(json.dumps(first.state_dict()))
    second = AEntController(coef=2e-4, **BAND)
    second.load_state_dict(state)
    assert second.value == first.value
    first.update(0.0, 4)
    second.update(0.0, 4)
    assert second.value == first.value
    with pytest.raises(KeyError):
        second.load_state_dict({})


# ---------------------------------------------------------------------------------------------------------------------
# The trainer's loss and gradients
# ---------------------------------------------------------------------------------------------------------------------

ACCUMULATION = 2
TEMPERATURE = 0.7
STRONG = dict(aent_coef_init=0.4, aent_coef_min=0.0, aent_coef_max=1.0, aent_coef_lr=0.05)  # a visible bonus
# The trainers of the loss tests: a generation batch of ACCUMULATION micro-batches, sampled at TEMPERATURE.
SAMPLING = dict(accumulation=ACCUMULATION, temperature=TEMPERATURE)


def reference_high_entropy_mask(entropy, mask, quantile):
    """TRL's ``get_high_entropy_mask`` semantics in float64: the valid tokens whose full entropy is at least the
    ``(1 − quantile)``-quantile (linear interpolation) of the valid tokens' entropies."""
    valid = entropy[mask.bool()]
    threshold = torch.quantile(valid, 1 - quantile)
    assert (valid - threshold).abs().min() > 1e-5, "fp32 and fp64 could disagree on the kept tokens"
    return (entropy >= threshold) & mask.bool()


@pytest.mark.parametrize(
    "clamp_fraction, loss_type, beta, quantile",
    [(0.3, "grpo", 0.04, 1.0), (0.5, "dapo", 0.0, 1.0), (0.0, "bnpo", 0.0, 1.0), (0.3, "grpo", 0.0, 0.5)],
)
def test_loss_and_gradients_equal_grpo_minus_clamped_entropy_bonus(
    toy_model_path, toy_tokenizer, monkeypatch, clamp_fraction, loss_type, beta, quantile, toy_trainer_of
):
    """TRL's loss (with the same ``top_entropy_quantile``) minus λ times the float64 clamped-entropy mean over the
    tokens TRL's high-entropy filter keeps (all valid tokens when the quantile is 1)."""
    options = dict(loss_type=loss_type, beta=beta, top_entropy_quantile=quantile)
    trl_trainer = toy_trainer_of(TRL, "trl", **SAMPLING, **options)
    ours = toy_trainer_of("aent", "ours", aent_clamp_fraction=clamp_fraction, **SAMPLING, **STRONG, **options)
    inputs = make_grpo_batch(trl_trainer.model, len(toy_tokenizer), seed=11)
    coef = ours.controllers["aent"].value
    assert coef == STRONG["aent_coef_init"]

    # One kernel call with clamp fraction p per loss (the clamped entropy comes out of the log-prob pass), and the
    # LM head's forward (the full logits) never runs.
    import trl_entropy.core.head

    kernel_calls, head_calls = [], []
    kernel = trl_entropy.core.head.chunked_logprob_entropy

    def spy(*args, **kwargs):
        kernel_calls.append(kwargs["clamp_fraction"])
        return kernel(*args, **kwargs)

    monkeypatch.setattr(trl_entropy.core.head, "chunked_logprob_entropy", spy)
    hook = ours.model.get_output_embeddings().register_forward_hook(lambda *args: head_calls.append(1))
    our_loss, our_grads = loss_and_gradients(ours, inputs)  # the last micro-batch of a cycle: λ moves afterwards
    hook.remove()
    assert kernel_calls == [clamp_fraction] and head_calls == []

    trl_loss, trl_grads = loss_and_gradients(trl_trainer, inputs)

    # The bonus term in float64 from the full logits of a float64 copy of the same weights, and its gradients.
    model64 = float64_model(toy_model_path)
    model64.train()
    clamped64 = reference_scores(model64, inputs, TEMPERATURE, clamp_fraction)
    mask = inputs["completion_mask"]
    bonus_mask = mask
    if quantile < 1:
        full64 = reference_scores(model64, inputs, TEMPERATURE, 0.0).detach()
        bonus_mask = reference_high_entropy_mask(full64, mask, quantile)
        assert 0 < bonus_mask.sum() < mask.sum()
        # The filter matters: the kept tokens' mean differs from all tokens' by far more than the tolerance.
        assert abs(token_mean(clamped64, bonus_mask) - token_mean(clamped64, mask)) > 0.01
    mean_clamped = token_mean(clamped64, mask)  # the controller's statistic: every valid token
    bonus = coef * token_mean(clamped64, bonus_mask) / ACCUMULATION
    bonus.backward()
    bonus_grads = {name: p.grad for name, p in model64.named_parameters() if p.grad is not None}

    expected_loss = trl_loss.double() - bonus.detach()
    assert abs(bonus.item()) > 1e3 * 1e-5 * abs(expected_loss.item()), "the bonus is too small to be tested"
    torch.testing.assert_close(our_loss.double(), expected_loss, rtol=1e-5, atol=1e-7)
    assert set(our_grads) == set(trl_grads) == set(bonus_grads)
    for name in trl_grads:
        expected = trl_grads[name].double() - bonus_grads[name]
        torch.testing.assert_close(our_grads[name].double(), expected, rtol=1e-4, atol=1e-6, msg=name)
    # The bonus's share of the gradient is far above the tolerance: leaving it out (or using another λ) would fail.
    bonus_norm = torch.cat([g.flatten() for g in bonus_grads.values()]).norm()
    trl_norm = torch.cat([g.flatten() for g in trl_grads.values()]).double().norm()
    assert bonus_norm > 0.01 * trl_norm  # 100 times the relative tolerance

    # The loss used λ_0; the cycle completed, so λ moved by the formula with the token-mean statistic.
    assert ours.controllers["aent"].value == pytest.approx(
        reference_step(
            coef,
            mean_clamped.item(),
            ours.args.aent_entropy_low,
            ours.args.aent_entropy_high,
            ours.args.aent_coef_lr,
            ours.args.aent_coef_min,
            ours.args.aent_coef_max,
        ),
        rel=1e-6,
    )
    assert ours.controllers["aent"].value != coef
    metrics = ours._metrics["train"]
    assert metrics["aent/coef"] == [ours.controllers["aent"].value]
    if clamp_fraction > 0:
        assert metrics["entropy/clamped"] == pytest.approx([mean_clamped.item()], rel=1e-5)
    else:
        assert "entropy/clamped" not in metrics


def test_clamped_entropy_differs_from_full_entropy(toy_model_path, toy_tokenizer):
    """The reference clamps: at p = 0.3 the clamped entropy is far from the full one on the toy model."""
    model64 = float64_model(toy_model_path)
    inputs = make_grpo_batch(model64, len(toy_tokenizer), seed=11)
    mask = inputs["completion_mask"]
    with torch.no_grad():
        clamped = token_mean(reference_scores(model64, inputs, TEMPERATURE, 0.3), mask)
        full = token_mean(reference_scores(model64, inputs, TEMPERATURE, 0.0), mask)
    assert abs(clamped - full) > 0.05


# ---------------------------------------------------------------------------------------------------------------------
# End to end: .train() on the toy task
# ---------------------------------------------------------------------------------------------------------------------

# A band above log V: the clamped entropy is always below it, so λ rises at every step (a visible trajectory).
E2E = dict(
    aent_entropy_low=10.0,
    aent_entropy_high=10.0,
    aent_coef_init=1e-3,
    aent_coef_lr=1e-2,
    aent_coef_min=0.0,
    aent_coef_max=1.0,
)


def test_train_logs_aent_metrics(warm_toy_policy_path, tmp_path):
    args = AEntConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        learning_rate=1e-4,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=0,
        **E2E,
    )
    trainer = AEntTrainer(
        model=warm_toy_policy_path, reward_funcs=toy_reward, args=args, train_dataset=build_toy_dataset(64, seed=0)
    )
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "aent/coef" in entry]
    assert [entry["step"] for entry in logs] == [1, 2]
    vocab = trainer.model.config.vocab_size
    kept = vocab - math.floor(trainer.args.aent_clamp_fraction * vocab)
    coefs = [entry["aent/coef"] for entry in logs]
    for entry in logs:
        assert 0.0 < entry["entropy/clamped"] <= math.log(kept) + 1e-5
        assert 0.0 < entry["entropy"] <= math.log(vocab) + 1e-5
        assert E2E["aent_coef_min"] <= entry["aent/coef"] <= E2E["aent_coef_max"]
    # Below the band at every step: λ rises by α(H_low − H̄) ≥ α(10 − log V) each step.
    rise = E2E["aent_coef_lr"] * (E2E["aent_entropy_low"] - math.log(vocab))
    assert coefs[0] >= E2E["aent_coef_init"] + rise and coefs[1] >= coefs[0] + rise
    assert coefs[-1] == trainer.controllers["aent"].value


# ---------------------------------------------------------------------------------------------------------------------
# A scheduled band and box (docs/aent.md, "Scheduled band and box"): the bounds move, λ stays the controller's state
# and is applied inside the box of each step
# ---------------------------------------------------------------------------------------------------------------------

BOUND_NAMES = ("aent_entropy_low", "aent_entropy_high", "aent_coef_min", "aent_coef_max")


def reference_bound(kind, s, start, final, w, decay, total):
    """A scheduled bound in float64: its start value through the warm-up, then linear or cosine to its final."""
    if final is None or s < w:
        return start
    d = total - w if decay is None else decay
    u = min(max((s - w) / max(d, 1), 0.0), 1.0)
    return (
        start + (final - start) * u
        if kind == "linear"
        else final + (start - final) * 0.5 * (1 + math.cos(math.pi * u))
    )


def reference_bounds(options, s, total):
    """``(H_low, H_high, λ_min, λ_max)`` at clock ``s`` of ``total`` for the config ``options``."""
    kind, w = options["aent_schedule"], options.get("aent_schedule_warmup_steps", 0)
    decay = options.get("aent_schedule_decay_steps")
    defaults = dict(aent_entropy_low=0.05, aent_entropy_high=0.23, aent_coef_min=1e-5, aent_coef_max=3e-3)
    return tuple(
        reference_bound(kind, s, options.get(name, defaults[name]), options.get(f"{name}_final"), w, decay, total)
        for name in BOUND_NAMES
    )


# The worked example's timing (S = 1000, w = 100): the band from [0.05, 0.23] to [0.02, 0.1], λ_max from 3e-3 to 0.
WORKED = dict(aent_entropy_low_final=0.02, aent_entropy_high_final=0.1, aent_coef_max_final=0.0)


@pytest.mark.parametrize("kind", ["linear", "cosine"])
@pytest.mark.parametrize("decay", [None, 450])
def test_the_band_and_box_at_each_step_are_the_formula(kind, decay):
    from trl_entropy.methods.aent import AENT_BOUNDS

    options = dict(aent_schedule=kind, aent_schedule_warmup_steps=100, aent_schedule_decay_steps=decay, **WORKED)
    config = toy_config(AEntConfig, aent_coef_min=0.0, aent_coef_init=0.0, **options)
    options["aent_coef_min"] = 0.0
    for s in [0, 1, 50, 99, 100, 101, 325, 550, 775, 999, 1000, 1200]:
        got = tuple(AENT_BOUNDS.values(config, s, 1000, num_iterations=1).values())
        assert got == pytest.approx(reference_bounds(options, s, 1000), rel=1e-12, abs=1e-15), s
    # Numbers by hand: linear, halfway through the decay (s = 550 of D = 900) the band is [0.035, 0.165].
    if kind == "linear" and decay is None:
        assert tuple(AENT_BOUNDS.values(config, 550, 1000, 1).values())[:2] == pytest.approx((0.035, 0.165))
        assert AENT_BOUNDS.values(config, 999, 1000, 1)["aent_coef_max"] == pytest.approx(3e-3 / 900)


def test_the_generation_cycle_clock_moves_the_bounds_once_per_cycle():
    """Three optimizer steps per cycle (steps_per_generation 3, accumulation 1): the clock is floor(s / 3) of 4."""
    from trl_entropy.methods.aent import AENT_BOUNDS

    options = dict(aent_schedule="linear", aent_entropy_low_final=0.01)
    config = toy_config(AEntConfig, entropy_schedule_unit="generation_cycle", steps_per_generation=3, **options)
    lows = [AENT_BOUNDS.values(config, s, 12, 1)["aent_entropy_low"] for s in range(7)]
    expected = [reference_bounds(options, s // 3, 4)[0] for s in range(7)]
    assert lows == pytest.approx(expected, rel=1e-12) and lows[0] == lows[2] != lows[3]


def test_an_unknown_run_length_needs_the_decay_steps():
    from trl_entropy.methods.aent import AENT_BOUNDS

    config = toy_config(AEntConfig, aent_schedule="linear", aent_coef_max_final=1e-3)
    with pytest.raises(ValueError, match="aent_schedule_decay_steps"):
        AENT_BOUNDS.values(config, 3, -1, 1)
    config = toy_config(AEntConfig, aent_schedule="linear", aent_coef_max_final=1e-3, aent_schedule_decay_steps=10)
    assert AENT_BOUNDS.values(config, 5, -1, 1)["aent_coef_max"] == pytest.approx(3e-3 + (1e-3 - 3e-3) * 0.5)


def test_the_coefficient_is_clamped_into_the_box_and_the_update_uses_the_steps_band():
    controller = AEntController(coef=0.02, **BAND)
    # The regulariser reads: λ in the box, nothing taken.
    assert controller.coef_in((0.0, 1.0, 1e-3, 5e-3)) == 5e-3
    assert controller.value == 0.02 and (controller.low, controller.coef_max) == (BAND["low"], BAND["coef_max"])
    assert controller.coef_in((0.0, 1.0, 0.03, 0.05)) == 0.03  # raised to λ_min
    # After a training micro-batch the controller takes the step's band and box and the clamped λ; the update at that
    # step uses them.
    step_bounds = (0.4, 0.6, 1e-3, 8e-3)
    controller.take_bounds(step_bounds)
    assert controller.value == 8e-3 and (controller.low, controller.high) == (0.4, 0.6)
    controller.update(0.1, step=3)  # below the step's band: rises by α(0.4 − 0.1), clipped to the step's λ_max
    assert controller.value == 8e-3
    controller.take_bounds((0.4, 0.6, 1e-3, 1.0))
    controller.update(0.1, step=4)
    assert controller.value == pytest.approx(reference_step(8e-3, 0.1, 0.4, 0.6, BAND["lr"], 1e-3, 1.0), rel=1e-12)
    controller.update(0.7, step=5)  # above the band: falls by α(0.7 − 0.6), not by α(0.7 − 0.23) of the config's
    assert controller.value == pytest.approx(8e-3 + 0.3e-3 - 0.1e-3, rel=1e-12)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"aent_coef_max_final": 1e-3}, "aent_coef_max_final=0.001 would be ignored: aent_schedule='constant'"),
        ({"aent_schedule_warmup_steps": 5}, "aent_schedule_warmup_steps=5 would be ignored"),
        ({"aent_schedule": "cosine"}, "aent_schedule='cosine' moves nothing: set a final value.*aent_coef_max_final"),
        (
            {"aent_schedule": "linear", "aent_coef_max_final": 1e-3, "aent_adaptive": False},
            "aent_adaptive=False leaves unused",
        ),
        ({"aent_schedule": "linear", "aent_entropy_low_final": 0.1, "aent_adaptive": False}, "aent_adaptive"),
        ({"aent_schedule": "linear", "aent_entropy_low_final": 0.3}, "aent_entropy_low_final=0.3 is above aent_ent"),
        (
            {"aent_schedule": "linear", "aent_entropy_low_final": 0.2, "aent_entropy_high_final": 0.1},
            "aent_entropy_low_final=0.2 is above aent_entropy_high_final=0.1",
        ),
        ({"aent_schedule": "cosine", "aent_coef_max_final": 1e-6}, "aent_coef_min=1e-05 is above aent_coef_max_final"),
        ({"aent_schedule": "linear", "aent_coef_min_final": 4e-3}, "aent_coef_min_final=0.004 is above aent_coef_max"),
    ],
)
def test_a_bad_band_or_box_schedule_is_refused_naming_its_fields(options, message):
    with pytest.raises(ValueError, match=message):
        toy_config(AEntConfig, **options)


def test_a_band_and_box_schedule_in_order_at_both_ends_is_accepted():
    toy_config(
        AEntConfig,
        aent_schedule="cosine",
        aent_entropy_low_final=0.3,  # the band moves up past the old H_high, in order at both ends
        aent_entropy_high_final=0.5,
        aent_coef_min_final=0.0,
        aent_coef_max_final=1e-5,
        aent_schedule_warmup_steps=3,
        aent_schedule_decay_steps=7,
    )


# A run of four steps of two-step cycles (num_iterations 2: updates at steps 2 and 4, tests/_support/resume.py). The
# clamped entropy is at most log(33) ≈ 3.5 < H_low at every step, whatever is sampled, so λ rises at each update by
# α(H_low(s) − H̄), between 0.00225 and 0.00575 at the first one: λ_max(1) = 0.016 leaves it free (the band of its step
# decides), λ_max(2) = 0.012 clamps it at the next cycle's start, and λ_max(3) = 0.008 caps the second update.
SCHEDULED_RUN = dict(
    aent_schedule="linear",
    aent_entropy_low=6.0,
    aent_entropy_low_final=5.0,
    aent_entropy_high=7.0,
    aent_entropy_high_final=6.0,
    aent_coef_init=0.01,
    aent_coef_lr=1e-3,
    aent_coef_min=0.0,
    aent_coef_min_final=0.004,
    aent_coef_max=0.02,
    aent_coef_max_final=0.004,
)


def scheduled_run(path, output_dir, resume_from=None, **changes):
    from _support.distributed_run import ControllerRecorder, make_trainer, ranked_reward
    from _support.resume import STEPS

    options = {**SCHEDULED_RUN, "max_steps": STEPS, **changes}
    trainer = make_trainer(
        "aent",
        path,
        str(output_dir),
        rollout=None,
        reward=ranked_reward,
        per_device_train_batch_size=16,
        num_iterations=2,
        save_strategy="steps",
        save_steps=1,
        **options,
    )
    recorder = ControllerRecorder.attached_to(trainer)
    trainer.train(resume_from_checkpoint=resume_from)
    return trainer, recorder


@pytest.fixture(scope="module")
def straight_scheduled_run(warm_toy_policy_path, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("aent_scheduled")
    trainer, recorder = scheduled_run(warm_toy_policy_path, output_dir)
    return output_dir, trainer, recorder


def logged_by_step(trainer, key):
    return {entry["step"]: entry[key] for entry in trainer.state.log_history if key in entry and "step" in entry}


def test_the_coefficient_follows_the_float64_replay_with_each_steps_band_and_box(straight_scheduled_run):
    _, trainer, recorder = straight_scheduled_run
    (means,) = recorder.statistics.values()  # H̄ of the updates at steps 2 and 4
    assert len(means) == 2 and all(mean < 3.6 for mean in means)  # below H_low at every step by construction
    coef, expected, update = SCHEDULED_RUN["aent_coef_init"], {}, iter(means)
    for step in range(1, 5):
        low, high, coef_min, coef_max = reference_bounds(SCHEDULED_RUN, step - 1, 4)  # the step's clock: s = step − 1
        coef = min(max(coef, coef_min), coef_max)  # the box at the step's start
        if step % 2 == 0:  # the step that ends the cycle: eq. 4.1 with the step's band, then the step's box
            mean = next(update)
            coef = coef - SCHEDULED_RUN["aent_coef_lr"] * (min(0.0, mean - low) + max(0.0, mean - high))
            coef = min(max(coef, coef_min), coef_max)
        expected[step] = coef
    assert logged_by_step(trainer, "aent/coef") == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert recorder.values == pytest.approx(list(expected.values()), rel=1e-9, abs=1e-15)
    # The construction holds: the first update is inside the box, the next cycle's start and the second update clamp.
    assert 0.012 < expected[2] < 0.016 and expected[3] == pytest.approx(0.012) and expected[4] == pytest.approx(0.008)
    for name, key in zip(BOUND_NAMES, ("aent/h_low", "aent/h_high", "aent/coef_min", "aent/coef_max"), strict=True):
        index = BOUND_NAMES.index(name)
        formula = {step: reference_bounds(SCHEDULED_RUN, step - 1, 4)[index] for step in range(1, 5)}
        assert logged_by_step(trainer, key) == pytest.approx(formula, rel=1e-12), key


def test_a_resumed_scheduled_run_continues_the_coefficient_and_band_sequences(
    straight_scheduled_run, warm_toy_policy_path, tmp_path
):
    """Resumed inside the first cycle: the same λ (its statistic summed again over the restored cycle, to rounding)
    and exactly the same band and box, a function of the restored step."""
    from _support.resume import CHECKPOINT

    output_dir, straight, straight_recorder = straight_scheduled_run
    checkpoint = str(output_dir / f"checkpoint-{CHECKPOINT}")
    resumed, recorder = scheduled_run(warm_toy_policy_path, tmp_path, checkpoint)
    assert recorder.values == pytest.approx(straight_recorder.values[CHECKPOINT:], rel=1e-6, abs=1e-12)
    for key in ("aent/coef", "aent/h_low", "aent/h_high", "aent/coef_min", "aent/coef_max"):
        later = {step: value for step, value in logged_by_step(straight, key).items() if step > CHECKPOINT}
        got = {step: value for step, value in logged_by_step(resumed, key).items() if step > CHECKPOINT}
        assert sorted(got) == [2, 3, 4]
        assert got == (pytest.approx(later, rel=1e-6, abs=1e-12) if key == "aent/coef" else later), key


def test_a_checkpoint_restores_a_coefficient_only_the_runs_widest_box_holds(toy_tokenizer, tmp_path, toy_trainer_of):
    """The quick loop's check of the resumed run's fact above, through the checkpoint's save and restore functions: at
    the end of step 1 of 4, λ = 0.015 lies in the run's widest box [0, 0.02] but not in its narrowest, [0.004, 0.004]
    (the last step's); it comes back as it was, and the next loss step (s = 1: the box [0.001, 0.016]) keeps it."""
    coefficient, step = 0.015, 1
    _, _, coef_min, coef_max = reference_bounds(SCHEDULED_RUN, step, 4)
    run = SCHEDULED_RUN
    narrowest = (
        max(run["aent_coef_min"], run["aent_coef_min_final"]),
        min(run["aent_coef_max"], run["aent_coef_max_final"]),
    )
    assert coef_min < coefficient < coef_max and not narrowest[0] <= coefficient <= narrowest[1]
    options = dict(SCHEDULED_RUN, max_steps=4)
    saved = toy_trainer_of("aent", "saved", **SAMPLING, **options)
    saved.controllers["aent"].value = coefficient
    saved.state.global_step = step
    resumed = toy_trainer_of("aent", "resumed", **SAMPLING, **options)
    resume_from_saved(saved, resumed, str(tmp_path / f"checkpoint-{step}"))
    assert resumed.controllers["aent"].value == coefficient
    inputs = make_grpo_batch(resumed.model, len(toy_tokenizer), seed=3)
    losses = []
    for trainer in (saved, resumed):
        trainer.state.max_steps = 4
        set_sync(trainer, False)  # the step's first micro-batch: the cycle's update comes later
        losses.append(trainer.compute_loss(trainer.model, dict(inputs)).item())
    assert resumed.controllers["aent"].value == coefficient and losses[1] == losses[0]
    assert resumed._metrics["train"]["aent/coef_max"] == [pytest.approx(coef_max, rel=1e-12)]


@pytest.mark.parametrize(
    ("changed", "named"),
    [({"aent_entropy_low_final": 4.0}, "aent_entropy_low_final: 5.0 → 4.0"), ({"max_steps": 6}, "max_steps: 4 → 6")],
)
def test_a_changed_band_schedule_on_resume_is_named(
    changed, named, straight_scheduled_run, warm_toy_policy_path, tmp_path
):
    output_dir = straight_scheduled_run[0]
    with pytest.warns(UserWarning, match=named):
        scheduled_run(warm_toy_policy_path, tmp_path, str(output_dir / "checkpoint-3"), **changed)


def test_evaluation_reads_the_steps_box_and_changes_nothing(toy_tokenizer, toy_trainer_of):
    options = dict(SCHEDULED_RUN, aent_coef_init=0.01)
    trainer = toy_trainer_of("aent", **SAMPLING, **options)
    trainer.state.max_steps, trainer.state.global_step = 4, 2  # λ_max(2) = 0.012
    controller = trainer.controllers["aent"]
    controller.value = 0.5  # above every box of the run: what evaluation must clamp and leave as it is
    before = dict(vars(controller))
    inputs = make_grpo_batch(trainer.model, len(toy_tokenizer), seed=7)
    trainer.model.eval()
    with torch.no_grad():
        outside = trainer.compute_loss(trainer.model, dict(inputs))
        controller.value = 0.012
        at_the_cap = trainer.compute_loss(trainer.model, dict(inputs))
        controller.value = 0.0
        without = trainer.compute_loss(trainer.model, dict(inputs))
    torch.testing.assert_close(outside, at_the_cap, rtol=0, atol=0)  # λ applied: the step's λ_max
    assert abs(outside - without) > 1e-3  # the bonus counts: the comparison is not vacuous
    controller.value = 0.5
    assert vars(controller) == before
    assert not any(key.startswith("aent/") for mode in ("train", "eval") for key in trainer._metrics[mode])


# The pair table's piece (tests/compose/test_pairs.py): the regulariser.


def pair_clamped_entropy(logits, fraction):
    """AEnt (arXiv:2509.03493): the entropy of the softmax over the top (1 − p) of the vocabulary by logit."""
    k = math.floor(fraction * logits.size(-1))
    kth = logits.detach().sort(-1).values[..., k - 1 : k]
    kept = logits.detach() > kth
    log_softmax = torch.log_softmax(logits.masked_fill(~kept, -math.inf), -1)
    return -(log_softmax.exp().masked_fill(~kept, 0.0) * log_softmax.masked_fill(~kept, 0.0)).sum(-1)


def pair_clamped_entropy_bonus(log_probs, old_log_probs, entropy, logits, sequence_advantages, mask, s):
    """AEnt's ``−λ·mean H_clamped``, λ at its initial value."""
    return -s["aent_coef_init"] * weighted_mean(pair_clamped_entropy(logits, s["aent_clamp_fraction"]), mask)


PAIR = PairReference(
    settings=dict(aent_coef_init=0.1, aent_coef_max=1.0, aent_clamp_fraction=0.3),
    methods={"aent": PairMethod("entropy regulariser", regulariser=pair_clamped_entropy_bonus)},
)
