"""`benchmarks/bf16_clip_flips.py`, the measurement of how often bf16 scoring flips PPO's clip decision, on cases
built so that the answer is known: hand-built ratios on either side of the clip bounds (token and sequence level, two
clip ranges, every aggregation's weights), and log-probs that bf16 rounding carries across 1 + ε and 1 − ε. On a tiny
model: both scorings read the completion tokens at the right positions, and a batch's measurement leaves the weights
as it found them."""

import math
from pathlib import Path

import pytest
import torch


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def flips(monkeypatch):
    """The benchmark script as a module (it imports `chat_batches` from its own folder)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bf16_clip_flips

    return bf16_clip_flips


def setting(flips, label):
    return next(s for s in flips.SETTINGS if s.label == label)


# Two ratios per token, the reference's and the variant's; advantages +1, −1, 0; one padded token (a flip there must
# not count). With ε = 0.2: row 0 (A > 0) goes into the upper clip at t0 and stays clipped at t1; row 1 (A < 0) leaves
# the lower clip at t0, stays unclipped above 1 + ε at t1 (no clip there for A < 0) and enters it at t3; row 2 (A = 0)
# never clips. So 2 tokens into the clip, 1 out of it, of 9 valid ones.
REFERENCE = [[1.19, 1.25, 1.00, 1.19], [0.79, 1.30, 0.90, 0.81], [1.50, 0.50, 1.00, 1.00]]
VARIANT = [[1.21, 1.25, 1.00, 1.21], [0.81, 1.30, 0.90, 0.79], [0.50, 1.50, 1.00, 1.00]]
MASK = [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]]
ADVANTAGES = [1.0, -1.0, 0.0]


def hand_built(flips, label):
    zeros = torch.zeros(3, 4)  # old log-probs: the log-probs are the log-ratios
    return flips.compare_clip_decisions(
        torch.tensor(VARIANT).log(),
        zeros,
        torch.tensor(REFERENCE).log(),
        zeros,
        torch.tensor(ADVANTAGES),
        torch.tensor(MASK),
        setting(flips, label),
    )


def test_token_level_flips_are_counted_by_direction_and_the_bias_is_the_mean_quotient(flips):
    sums = hand_built(flips, "bnpo")
    assert (sums["tokens"], sums["reference_clipped"], sums["clipped"]) == (9, 2, 3)
    assert (sums["into_clip"], sums["out_of_clip"]) == (2, 1)
    assert sums["flipped_weight"] / sums["weight"] == pytest.approx(3 / 9)
    quotients = [v / r for vs, rs, ms in zip(VARIANT, REFERENCE, MASK) for v, r, m in zip(vs, rs, ms) if m]
    assert sums["quotient"] / 9 - 1 == pytest.approx(sum(quotients) / 9 - 1)
    assert sums["log_quotient"] == pytest.approx(sum(math.log(q) for q in quotients))
    assert sums["quotient_sq"] == pytest.approx(sum(q * q for q in quotients))


def test_each_loss_type_weighs_the_flipped_tokens_as_it_aggregates(flips):
    # grpo: every row weighs 1, spread over its tokens: (1/3 + 2/4 + 0/2) / 3; the token-sum types weigh tokens alike.
    assert hand_built(flips, "grpo")["flipped_weight"] == pytest.approx((1 / 3 + 2 / 4) / 3)
    for label in ("bnpo", "dr_grpo", "dapo"):
        sums = hand_built(flips, label)
        assert (sums["into_clip"], sums["out_of_clip"]) == (2, 1), label
        assert sums["flipped_weight"] / sums["weight"] == pytest.approx(3 / 9), label


def test_dapo_clip_higher_moves_the_upper_bound(flips):
    # With ε_high = 0.28, 1.21 and 1.25 are inside the range: only row 1's lower-bound flips remain.
    sums = hand_built(flips, "dapo, ε_high 0.28")
    assert (sums["reference_clipped"], sums["clipped"], sums["into_clip"], sums["out_of_clip"]) == (1, 1, 1, 1)


def test_a_sequence_ratio_flips_all_the_tokens_of_its_sequence(flips):
    # Row 0's mean log-ratio is log 1.19 for the reference and log 1.21 for the variant, spread unevenly over its 3
    # valid tokens: the whole sequence enters the clip (A > 0). Row 1 stays at ratio 1.
    reference = torch.tensor([[math.log(1.19) + 0.3, math.log(1.19) - 0.3, math.log(1.19), 5.0], [0.0] * 4])
    variant = reference + torch.tensor([[math.log(1.21 / 1.19)] * 3 + [-9.0], [0.0] * 4])
    zeros = torch.zeros(2, 4)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    sums = flips.compare_clip_decisions(
        variant, zeros, reference, zeros, torch.tensor([1.0, -1.0]), mask, setting(flips, "luspo (sequence ratio)")
    )
    assert (sums["tokens"], sums["reference_clipped"], sums["clipped"], sums["into_clip"]) == (7, 0, 3, 3)
    assert sums["flipped_weight"] / sums["weight"] == pytest.approx(3 / 7)
    assert sums["quotient"] == pytest.approx(3 * 1.21 / 1.19 + 4)


def test_bf16_rounding_of_the_log_probs_flips_the_tokens_it_carries_across_a_bound(flips):
    # bf16 keeps 8 significant bits: between 2 and 4 its grid step is 2**-6. From an old log-prob of -3 (on the grid):
    # -2.8184 rounds to -2.8125, taking the ratio from e^0.1816 = 1.1991 to e^0.1875 = 1.2062, into the upper clip
    # (A > 0); -3.2265 rounds to -3.21875, from e^-0.2265 = 0.7973 to e^-0.21875 = 0.8035, out of the lower clip
    # (A < 0); -2.9 rounds to -2.90625, both ratios inside the range.
    old = torch.full((3, 1), -3.0)
    new = torch.tensor([[-2.8184], [-3.2265], [-2.9]])
    assert flips.round_to_bf16(new).flatten().tolist() == [-2.8125, -3.21875, -2.90625]
    sums = flips.compare_clip_decisions(
        flips.round_to_bf16(new),
        flips.round_to_bf16(old),
        new,
        old,
        torch.tensor([1.0, -1.0, 1.0]),
        torch.ones(3, 1),
        setting(flips, "grpo"),
    )
    assert (sums["reference_clipped"], sums["clipped"], sums["into_clip"], sums["out_of_clip"]) == (1, 1, 1, 1)


def test_wilson_interval_holds_the_proportion_and_stays_in_the_unit_interval(flips):
    low, high = flips.wilson_interval(0, 1000)
    assert low == 0.0 and 0.003 < high < 0.004  # about 3.84 / 1000 at no count
    low, high = flips.wilson_interval(50, 100)
    assert low < 0.5 < high and high - 0.5 == pytest.approx(0.5 - low)


# ---------------------------------------------------------------------------------------------------------------------
# A tiny model (loss_step tier)
# ---------------------------------------------------------------------------------------------------------------------


def tiny_model_and_batch():
    """A tiny Llama with peaked next-token distributions (its log-probs spread over several nats, so that a token
    scored at the wrong position is far off), and a batch with a left-padded prompt, a padded completion tail and
    advantages of both signs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(20.0)
    generator = torch.Generator().manual_seed(1)
    prompt_mask = torch.ones(4, 5, dtype=torch.long)
    prompt_mask[0, :2] = 0
    completion_mask = torch.ones(4, 6, dtype=torch.long)
    completion_mask[1, 4:] = 0
    batch = {
        "prompt_ids": torch.randint(0, 64, (4, 5), generator=generator),
        "prompt_mask": prompt_mask,
        "completion_ids": torch.randint(0, 64, (4, 6), generator=generator),
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
    }
    return model, batch


def full_logits_log_probs(model, batch, shift=0):
    """Float64 log-probs of the completion tokens from the full logits; ``shift`` reads them one position off."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.double()
    length = batch["completion_ids"].size(1)
    log_softmax = torch.log_softmax(logits[:, -length - 1 - shift : logits.size(1) - 1 - shift], -1)
    return log_softmax.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)


def test_both_scorings_read_each_completion_token_at_its_position(flips):
    from chat_batches import score_fp32

    model, batch = tiny_model_and_batch()
    reference = full_logits_log_probs(model, batch)
    off_by_one = full_logits_log_probs(model, batch, shift=1)
    assert (off_by_one - reference).abs().max() > 1.0  # the model is peaked enough to tell positions apart
    with torch.no_grad():
        fp32, _ = score_fp32(model, batch)
    torch.testing.assert_close(fp32.double(), reference, rtol=0, atol=1e-4)
    model_bf16 = tiny_model_and_batch()[0].to(torch.bfloat16)
    bf16 = flips.score_bf16(model_bf16, batch)
    assert bf16.dtype == torch.float32
    assert 0 < (bf16.double() - reference).abs().max() < 0.5  # bf16 weights and logits, at the same positions


def test_a_batch_measurement_puts_the_weights_back_and_a_zero_step_moves_no_ratio(flips):
    model, batch = tiny_model_and_batch()
    model_bf16 = tiny_model_and_batch()[0].to(torch.bfloat16)
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    sums = flips.measure_batch(model, model_bf16, batch, learning_rates=(1e-2, 0.0))
    for name, parameter in model.named_parameters():
        assert torch.equal(parameter, before[name]), name
    assert {setup for setup, _, _ in sums} == {"step, lr 0.01", "step, lr 0", "mismatch"}
    assert len(sums) == 3 * len(flips.VARIANTS) * len(flips.SETTINGS)
    # The step at 1e-2 moved the policy (the fp32 ratios clip somewhere); the step at 0 did not: θ1 = θ0 and every
    # variant's ratio is exactly the reference's, 1. The step at 0 came after the other: the weights were put back.
    assert any(row["reference_clipped"] for (setup, _, _), row in sums.items() if setup == "step, lr 0.01")
    for (setup, variant, label), row in sums.items():
        if setup == "step, lr 0":
            assert row["reference_clipped"] == row["clipped"] == 0, (variant, label)
            assert row["quotient"] == row["tokens"] == 22, (variant, label)
