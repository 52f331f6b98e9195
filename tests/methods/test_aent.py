"""AEnt: config, the coefficient controller, the loss and gradients against a float64 reference (TRL's
high-entropy filter included) and an end-to-end run on the toy task. Checkpoints: tests/trainer/test_resume.py;
accumulation
and cycle timing: tests/trainer/test_accumulation.py; invalid config values: tests/trainer/test_bad_input.py."""

import json
import math

import pytest
import torch
from _support.grpo import build_trainer as shared_build_trainer
from _support.grpo import loss_and_gradients, make_grpo_batch, toy_config
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

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
    prompt_len = inputs["prompt_ids"].size(1)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    logits = model64(input_ids=input_ids, attention_mask=attention_mask).logits[:, prompt_len - 1 : -1]
    return reference_clamped_entropy(logits / temperature, clamp_fraction)


def token_mean(values, mask):
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum()


# ---------------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------------


def make_config(tmp_path, **options):
    return toy_config(AEntConfig, tmp_path, **options)


def test_config_defaults_are_the_reference_values(tmp_path):
    config = make_config(tmp_path)
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


def test_config_accepts_edge_values(tmp_path):
    # p = 0 (full entropy), an empty band, a degenerate box, α = 0; λ_0 outside the box with a fixed coefficient.
    make_config(tmp_path, aent_clamp_fraction=0.0, aent_entropy_low=0.1, aent_entropy_high=0.1, aent_coef_lr=0.0)
    make_config(tmp_path, aent_coef_min=1e-3, aent_coef_max=1e-3, aent_coef_init=1e-3)
    make_config(tmp_path, aent_adaptive=False, aent_coef_init=0.05)


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


def build_trainer(trainer_class, config_class, path, tokenizer, output_dir, accumulation=ACCUMULATION, **options):
    return shared_build_trainer(
        trainer_class,
        config_class,
        path,
        tokenizer,
        output_dir,
        accumulation,
        temperature=TEMPERATURE,
        steps_per_generation=accumulation,
        **options,
    )


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
    toy_model_path, toy_tokenizer, tmp_path, monkeypatch, clamp_fraction, loss_type, beta, quantile
):
    """TRL's loss (with the same ``top_entropy_quantile``) minus λ times the float64 clamped-entropy mean over the
    tokens TRL's high-entropy filter keeps (all valid tokens when the quantile is 1)."""
    options = dict(loss_type=loss_type, beta=beta, top_entropy_quantile=quantile)
    trl_trainer = build_trainer(GRPOTrainer, GRPOConfig, toy_model_path, toy_tokenizer, tmp_path / "trl", **options)
    ours = build_trainer(
        AEntTrainer,
        AEntConfig,
        toy_model_path,
        toy_tokenizer,
        tmp_path / "ours",
        aent_clamp_fraction=clamp_fraction,
        **STRONG,
        **options,
    )
    inputs = make_grpo_batch(trl_trainer.model, len(toy_tokenizer), seed=11)
    coef = ours.aent_coef
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
    model64 = AutoModelForCausalLM.from_pretrained(toy_model_path, dtype=torch.float64)
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
    assert ours.aent_coef == pytest.approx(
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
    assert ours.aent_coef != coef
    metrics = ours._metrics["train"]
    assert metrics["aent/coef"] == [ours.aent_coef]
    if clamp_fraction > 0:
        assert metrics["entropy/clamped"] == pytest.approx([mean_clamped.item()], rel=1e-5)
    else:
        assert "entropy/clamped" not in metrics


def test_clamped_entropy_differs_from_full_entropy(toy_model_path, toy_tokenizer):
    """The reference clamps: at p = 0.3 the clamped entropy is far from the full one on the toy model."""
    model64 = AutoModelForCausalLM.from_pretrained(toy_model_path, dtype=torch.float64)
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
    assert coefs[-1] == trainer.aent_coef
