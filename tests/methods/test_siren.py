"""SIREN, selective, self-anchored entropy regularisation (Jiang et al., arXiv:2509.25133; the authors' code,
Linn3a/siren at fa59a8d; docs/siren.md).

* the worked example of docs/siren.md number for number: the peak-entropy mask's quantiles (the padded position left
  out), the mean, the penalty, the loss and its gradients, as pure functions and through the trainer's loss step;
* the loss and every gradient of a training step against a float64 SIREN loss written here from the full logits, for
  each loss type;
* the anchor: measured once on the first generation batch under the rollout policy (against the float64 top-p
  entropy of that batch), never again, not on resume either; a given anchor is never measured;
* the coefficient's schedule, and the config's refusals naming the fields.

The shared suites (the neutral setting against trl.GRPOTrainer, bad input, two processes, combinations and their
float64 reference, docs) cover SIREN through the registry. The kernel's top-p entropy is tested in tests/kernels."""

import math

import pytest
import torch
from _reference.float64_policy import completion_logits, float64_model
from _reference.pairs import PairMethod, PairReference
from _support.checkpoint_files import resume_from_saved
from _support.grpo import SMALL_BATCH, build_trainer, loss_and_gradients, make_grpo_batch, toy_config, toy_trainer

from trl_entropy.core.batch import CompletionBatch
from trl_entropy.core.trl.objectives import LOSS_TYPES
from trl_entropy.methods.siren import (
    SIRENConfig,
    SIRENPart,
    SIRENTrainer,
    peak_entropy_mask,
    sequence_mean_token_mean,
    siren_penalty,
)


# SIREN's formulas in float64, the authors' functions written out (its tests and its piece of the pair table use them).


def top_p_entropy(logits, p, k, include_crossing=False):
    """SIREN (arXiv:2509.25133; the authors' ``efficient_top_p_sampling``): the entropy of the softmax renormalised
    over the logits ranked down whose cumulative full-softmax mass stays below ``p``, among the ``k`` largest (the
    token whose mass crosses ``p`` left out, or kept with ``include_crossing``); 0 with no gradient on an empty set.
    Returns ``(entropy, set size)``."""
    probs = torch.softmax(logits.detach(), -1)
    ordered = probs.sort(-1, descending=True)
    mass = ordered.values.cumsum(-1)
    before = mass - ordered.values if include_crossing else mass
    rank = torch.arange(logits.size(-1))
    keep_ranked = (before < p) & (rank < k)
    kept = torch.zeros_like(keep_ranked).scatter(-1, ordered.indices, keep_ranked)
    empty = ~kept.any(-1, keepdim=True)
    log_softmax = torch.log_softmax(logits.masked_fill(~kept | empty, -math.inf).masked_fill(empty, 0.0), -1)
    log_softmax = log_softmax.masked_fill(~kept, 0.0)  # before the product: 0 · (−inf) would make the gradient NaN
    return -(log_softmax.exp().masked_fill(~kept, 0.0) * log_softmax).sum(-1), kept.sum(-1).double()


def peak_mean(values, mask, ratio):
    """SIREN's peak-entropy mask and mean: per sequence the valid values strictly above their ``ratio``-quantile
    (linear interpolation), averaged per sequence, then over the sequences (one without a kept value counts 0)."""
    means = []
    for row, valid in zip(values, mask.bool(), strict=True):
        chosen = row.detach()[valid].sort().values
        if len(chosen) == 0:
            means.append(row.sum() * 0.0)
            continue
        position = ratio * (len(chosen) - 1)
        low = math.floor(position)
        quantile = chosen[low] + (position - low) * (chosen[min(low + 1, len(chosen) - 1)] - chosen[low])
        keep = valid & (row.detach() > quantile)
        means.append((row * keep).sum() / keep.sum().clamp(min=1))
    return torch.stack(means).mean()


# The worked example: 2 sequences × 3 tokens, the last of the second padded; A = ±0.5 (scale_rewards="none"),
# on-policy, dr_grpo with max_completion_length 3, c = 0.005, anchor 0.5.
TOP_P_ENTROPY = [[0.2, 1.1, 0.6], [0.9, 0.0, 1.4]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
PROBABILITIES = [[0.7, 0.4, 0.9], [0.3, 0.8, 0.5]]
KEEP = [[False, True, False], [True, False, False]]  # q = 0.9 and 0.72; the padded 1.4 (> 0.72) is left out
PENALTY_GRADIENT = [[0.0, 0.0025, 0.0], [0.0025, 0.0, 0.0]]


def test_worked_example_the_mask_the_mean_and_the_penalty():
    values = torch.tensor(TOP_P_ENTROPY, dtype=torch.float64, requires_grad=True)
    keep = peak_entropy_mask(values, torch.tensor(MASK), 0.8)
    assert keep.tolist() == KEEP
    mean = sequence_mean_token_mean(values, keep)
    assert mean.item() == pytest.approx(1.0)
    penalty = siren_penalty(mean, 0.5, 0.005)
    assert penalty.item() == pytest.approx(0.00125)
    penalty.backward()
    torch.testing.assert_close(values.grad, torch.tensor(PENALTY_GRADIENT, dtype=torch.float64))
    # The float64 formula written out in the reference: the same mean.
    assert peak_mean(values, torch.tensor(MASK), 0.8).item() == pytest.approx(1.0)


def test_a_sequence_without_a_kept_token_counts_zero_and_still_counts():
    values = torch.tensor([[1.0, 1.0, 1.0], [0.5, 2.0, 0.0]])  # the first: equal values, none above its quantile
    keep = peak_entropy_mask(values, torch.ones(2, 3), 0.8)
    assert keep.tolist() == [[False, False, False], [False, True, False]]
    assert sequence_mean_token_mean(values, keep).item() == pytest.approx(1.0)  # (0 + 2.0) / 2


def example_trainer(path, tokenizer, output_dir, **options):
    options = {
        **SMALL_BATCH,
        "num_generations": 2,
        "max_completion_length": 3,
        "loss_type": "dr_grpo",
        "scale_rewards": "none",
        "siren_anchor": 0.5,
        **options,
    }
    return toy_trainer(SIRENTrainer, toy_config(SIRENConfig, output_dir, **options), path, tokenizer, accumulation=1)


def test_worked_example_through_the_trainer(toy_model_path, toy_tokenizer, tmp_path):
    trainer = example_trainer(toy_model_path, toy_tokenizer, tmp_path)
    trainer._metrics["train"].clear()
    log_probs = torch.tensor(PROBABILITIES).log().requires_grad_()
    top_p = torch.tensor(TOP_P_ENTROPY, requires_grad=True)
    batch = CompletionBatch(
        log_probs=log_probs,
        old_log_probs=log_probs.detach(),
        entropy=torch.zeros(2, 3),
        clamped_entropy=None,
        mask=torch.tensor(MASK),
        group_advantages=torch.tensor([[0.5], [-0.5]]),
        top_p_entropy=top_p,
        top_p_set_size=torch.tensor([[3.0, 0.0, 2.0], [1.0, 4.0, 9.0]]),
    )
    measured = []
    advantages = trainer.token_advantages(batch, measured)
    per_token = trainer.surrogate(batch, trainer.ratio(batch), advantages, trainer.clip_range(), measured)
    policy_loss, loss = trainer.aggregate(batch, per_token, {})
    loss = trainer.add_regularisers(batch, loss, policy_loss, None, measured)
    trainer.record_metrics(batch.mode, measured)
    loss.backward()
    assert policy_loss.item() == pytest.approx(-0.0833, abs=1e-4)
    assert loss.item() == pytest.approx(-0.0821, abs=1e-4)
    assert [[round(v, 4) + 0.0 for v in row] for row in log_probs.grad.tolist()] == [
        [-0.0833] * 3,
        [0.0833, 0.0833, 0],
    ]
    torch.testing.assert_close(top_p.grad, torch.tensor(PENALTY_GRADIENT))
    metrics = trainer._metrics["train"]
    assert metrics["siren/topp_entropy"] == [pytest.approx(1.0)]
    assert metrics["siren/penalty"] == [pytest.approx(0.00125)]
    assert metrics["siren/anchor"] == [0.5] and metrics["siren/coef"] == [0.005]
    assert metrics["siren/kept_fraction"] == [pytest.approx(2 / 5)]
    assert metrics["siren/topp_set_size"] == [pytest.approx((3 + 0 + 2 + 1 + 4) / 5)]
    assert metrics["siren/empty_set_fraction"] == [pytest.approx(1 / 5)]


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_loss_and_every_gradient_equal_a_float64_siren_loss(warm_toy_policy_path, toy_tokenizer, tmp_path, loss_type):
    """The penalty's value and every parameter's gradient against the float64 top-p entropy of the full logits, with
    the policy term the loss type's own (the neutral trainer's, which the registry's suite holds equal to TRL's). The
    warm policy is peaked: some positions' top token alone holds p (an empty set), others keep up to K tokens."""
    options = dict(siren_anchor=0.3, siren_coef=0.5, siren_top_p=0.95, siren_top_k=3, siren_mask_ratio=0.5)
    siren = build_trainer("siren", warm_toy_policy_path, toy_tokenizer, tmp_path / "a", loss_type=loss_type, **options)
    plain = build_trainer(
        "siren",
        warm_toy_policy_path,
        toy_tokenizer,
        tmp_path / "b",
        loss_type=loss_type,
        **options | {"siren_coef": 0.0},
    )
    model = float64_model(warm_toy_policy_path)
    inputs = make_grpo_batch(model, len(toy_tokenizer), seed=5)
    ours, ours_grads = loss_and_gradients(siren, inputs)
    base, base_grads = loss_and_gradients(plain, inputs)
    entropy, sizes = top_p_entropy(completion_logits(model, inputs), 0.95, 3)
    mask = inputs["completion_mask"].double()
    valid = sizes[mask.bool()]
    assert (valid == 0).any() and (valid == 3).any(), valid  # empty sets, and sets K cuts short (2 or more tokens)
    penalty = 0.5 * (peak_mean(entropy, mask, 0.5) - 0.3) ** 2
    penalty.backward()
    torch.testing.assert_close((ours - base).double(), penalty.detach(), rtol=1e-5, atol=1e-7)
    assert any(p.grad.abs().max() > 0 for p in model.parameters())
    for name, parameter in model.named_parameters():
        expected = parameter.grad
        # The policy term's gradient cancels in fp32: its rounding, ~1e-7 of its size, stays in the difference.
        atol = max(1e-7, 1e-5 * expected.abs().max().item(), 1e-6 * base_grads[name].abs().max().item())
        difference = (ours_grads[name] - base_grads[name]).double()
        torch.testing.assert_close(difference, expected, rtol=1e-4, atol=atol, msg=name)


# ---------------------------------------------------------------------------------------------------------------------
# The anchor
# ---------------------------------------------------------------------------------------------------------------------


def recorded_run(path, tokenizer, output_dir, **options):
    """A short toy run whose generation batches and anchor-measuring passes are recorded."""
    args = toy_config(SIRENConfig, output_dir, **SMALL_BATCH, logging_steps=1, save_steps=1, **options)
    trainer = toy_trainer(SIRENTrainer, args, path, tokenizer)
    part = trainer.part(SIRENPart.key)
    seen, measured = [], []
    seen_batch, measure = part.on_generation_batch, trainer.score_generation_batch

    def record_batch(batch):
        seen.append({key: value.clone() for key, value in batch.items() if torch.is_tensor(value)})
        seen_batch(batch)

    def record_measure(batch, rule=None):
        measured.append(rule)
        return measure(batch, rule)

    part.on_generation_batch, trainer.score_generation_batch = record_batch, record_measure
    return trainer, seen, measured


def test_the_anchor_is_measured_once_on_the_first_batch_under_the_rollout_policy(
    toy_model_path, toy_tokenizer, tmp_path
):
    initial = float64_model(toy_model_path)
    trainer, seen, measured = recorded_run(toy_model_path, toy_tokenizer, tmp_path, max_steps=3)
    trainer.train()
    assert len(seen) == 3 and len(measured) == 1  # three generation batches, one measurement
    first = seen[0]
    expected = float64_anchor(initial, first)
    assert trainer.part("siren").anchor == pytest.approx(expected, rel=1e-5)
    logged = [entry["siren/anchor"] for entry in trainer.state.log_history if "siren/anchor" in entry]
    assert logged == [pytest.approx(expected, rel=1e-5)] * 3


def test_a_resumed_run_keeps_the_anchor_and_never_measures_again(toy_model_path, toy_tokenizer, tmp_path):
    straight, _, _ = recorded_run(toy_model_path, toy_tokenizer, tmp_path / "straight", max_steps=2)
    straight.train()
    resumed, _, measured = recorded_run(toy_model_path, toy_tokenizer, tmp_path / "resumed", max_steps=2)
    resumed.train(resume_from_checkpoint=str(tmp_path / "straight" / "checkpoint-1"))
    assert measured == [] and resumed.part("siren").anchor == straight.part("siren").anchor


def float64_anchor(model, batch):
    """The anchor of a generation batch at the defaults (p 0.8, K 10000, ρ 0.8), from the float64 full logits."""
    with torch.no_grad():
        entropy, _ = top_p_entropy(completion_logits(model, batch), 0.8, 10000)
    return peak_mean(entropy, batch["completion_mask"].double(), 0.8).item()


def generation_batches(model, vocab_size):
    """Two training generation batches and an evaluation one, padded, whose float64 anchors differ."""
    return [make_grpo_batch(model, vocab_size, seed=seed, old_noise=None, ref=False) for seed in (1, 2, 3)]


def test_two_generation_batches_measure_the_anchor_once_on_the_first(toy_model_path, toy_tokenizer, toy_trainer_of):
    """The quick loop's check of the training run's fact above: an evaluation batch measures nothing, the first
    training batch measures the anchor (its float64 value), the second leaves it."""
    trainer = toy_trainer_of("siren")
    model = float64_model(toy_model_path)
    first, second, evaluation = generation_batches(model, len(toy_tokenizer))
    assert abs(float64_anchor(model, first) - float64_anchor(model, second)) > 1e-3  # a second measurement shows
    part = trainer.part(SIRENPart.key)
    trainer.model.eval()
    part.on_generation_batch(evaluation)
    assert trainer.part("siren").anchor is None
    trainer.model.train()
    part.on_generation_batch(first)
    part.on_generation_batch(second)
    assert trainer.part("siren").anchor == pytest.approx(float64_anchor(model, first), rel=1e-5)


def test_a_checkpoint_carries_the_anchor_and_the_resumed_trainer_never_measures(
    toy_model_path, toy_tokenizer, tmp_path, monkeypatch, toy_trainer_of
):
    """The quick loop's check of the resumed run's fact above, through the checkpoint's save and restore functions:
    the anchor measured before the checkpoint comes back bit for bit, and the resumed trainer's next generation batch
    measures nothing."""
    saved = toy_trainer_of("siren", "saved")
    model = float64_model(toy_model_path)
    first, second, _ = generation_batches(model, len(toy_tokenizer))
    saved.part(SIRENPart.key).on_generation_batch(first)
    saved.state.global_step = 1
    resumed = toy_trainer_of("siren", "resumed")
    resume_from_saved(saved, resumed, str(tmp_path / "checkpoint-1"))
    assert (
        resumed.part("siren").anchor
        == saved.part("siren").anchor
        == pytest.approx(float64_anchor(model, first), rel=1e-5)
    )
    measured = []
    monkeypatch.setattr(resumed, "score_generation_batch", lambda *arguments: measured.append(arguments))
    resumed.part(SIRENPart.key).on_generation_batch(second)
    assert measured == [] and resumed.part("siren").anchor == saved.part("siren").anchor


def test_a_given_anchor_is_never_measured(toy_model_path, toy_tokenizer, tmp_path):
    trainer, _, measured = recorded_run(toy_model_path, toy_tokenizer, tmp_path, max_steps=1, siren_anchor=0.25)
    trainer.train()
    assert measured == [] and trainer.part("siren").anchor == 0.25


# ---------------------------------------------------------------------------------------------------------------------
# The coefficient's schedule and the config
# ---------------------------------------------------------------------------------------------------------------------


def test_the_coefficient_follows_its_schedule(toy_model_path, toy_tokenizer, tmp_path):
    """Linear from 0.01 to 0 over a 4-step run after a 1-step warm-up from 0: c(s) as docs/schedules.md writes it."""
    options = dict(siren_coef=0.01, siren_coef_schedule="linear", siren_coef_final=0.0, siren_coef_warmup_steps=1)
    trainer, _, _ = recorded_run(toy_model_path, toy_tokenizer, tmp_path, max_steps=4, **options)
    trainer.train()
    logged = [entry["siren/coef"] for entry in trainer.state.log_history if "siren/coef" in entry]
    expected = [0.0] + [0.01 + (0.0 - 0.01) * (s - 1) / 3 for s in (1, 2, 3)]
    assert logged == pytest.approx(expected)


def test_each_steps_penalty_takes_the_coefficient_of_its_step(toy_model_path, toy_tokenizer, tmp_path):
    """The quick loop's check of the training run's fact above: the worked example's penalty (its mean 1.0, anchor
    0.5) at each step s of the same 4-step schedule is c(s)·0.25."""
    options = dict(siren_coef=0.01, siren_coef_schedule="linear", siren_coef_final=0.0, siren_coef_warmup_steps=1)
    trainer = example_trainer(toy_model_path, toy_tokenizer, tmp_path, max_steps=4, **options)
    trainer.state.max_steps = 4
    batch = CompletionBatch(
        log_probs=torch.tensor(PROBABILITIES).log(),
        old_log_probs=torch.tensor(PROBABILITIES).log(),
        entropy=torch.zeros(2, 3),
        clamped_entropy=None,
        mask=torch.tensor(MASK),
        group_advantages=torch.tensor([[0.5], [-0.5]]),
        top_p_entropy=torch.tensor(TOP_P_ENTROPY),
        top_p_set_size=torch.ones(2, 3),
    )
    for step, coefficient in enumerate([0.0] + [0.01 + (0.0 - 0.01) * (s - 1) / 3 for s in (1, 2, 3)]):
        trainer.state.global_step = step
        penalty, metrics = trainer.part(SIRENPart.key).regulariser(batch)
        assert metrics["siren/coef"] == pytest.approx(coefficient, abs=1e-15), step
        assert penalty.item() == pytest.approx(coefficient * 0.25, abs=1e-9), step


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"siren_top_p": 0.0}, "siren_top_p"),
        ({"siren_top_p": 1.5}, "siren_top_p"),
        ({"siren_top_k": 0}, "siren_top_k"),
        ({"siren_mask_ratio": 1.0}, "siren_mask_ratio"),
        ({"siren_coef": -0.1}, "siren_coef"),
        ({"siren_coef_schedule": "linear"}, "siren_coef_schedule='linear' needs siren_coef_final"),
        ({"siren_coef_final": 0.0}, "siren_coef_final=0.0 would be ignored"),
        ({"siren_coef_warmup_start": 0.1}, "siren_coef_warmup_start=0.1 would be ignored"),
        ({"entropy_coef": 0.01}, "SIREN controls entropy itself"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(options, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        toy_config(SIRENConfig, tmp_path, **options)


def test_the_defaults_are_the_authors():
    config = SIRENConfig(output_dir="unused", use_cpu=True)
    values = (config.siren_coef, config.siren_top_p, config.siren_top_k, config.siren_mask_ratio)
    assert values == (0.005, 0.8, 10000, 0.8) and config.siren_anchor is None and not config.siren_include_crossing
    assert math.isclose(config.entropy_coef, 0.0)


# The pair table's piece (tests/compose/test_pairs.py): the regulariser.


def pair_siren_regulariser(log_probs, old_log_probs, entropy, logits, sequence_advantages, mask, s):
    """SIREN's ``c·(peak mean H^p − H_anchor)²``, the anchor given."""
    entropy_p, _ = top_p_entropy(logits, s["siren_top_p"], s["siren_top_k"])
    return s["siren_coef"] * (peak_mean(entropy_p, mask, s["siren_mask_ratio"]) - s["siren_anchor"]) ** 2


PAIR = PairReference(
    settings=dict(siren_coef=0.5, siren_top_p=0.5, siren_top_k=20, siren_mask_ratio=0.5, siren_anchor=0.3),
    methods={"siren": PairMethod("entropy regulariser", regulariser=pair_siren_regulariser)},
)
