"""The table of places (``trl_entropy/core/places.py``): each place's rule, as the step applies it to two parts.

Two stand-in parts answer at every place, each with a value of its own, and every step of the trainer that asks a
place is called: the result must be what the place's rule makes of the two answers, written out here by hand."""

import pytest
import torch
from _support.grpo import build_trainer

from trl_entropy.core.batch import CompletionBatch
from trl_entropy.core.parts import MethodPart, TokenGate, TopPRule
from trl_entropy.core.places import PLACES, Place, Rule, fold
from trl_entropy.core.trl.advantages import advantages_around_baseline


# The rules as the library promises them (docs/composing.md), written independently of the table.
PROMISED = {
    Place.GROUP_BASELINE: Rule.LAST,
    Place.ROLLOUT_REJECTION: Rule.CHAIN,
    Place.CLAMP_FRACTION: Rule.MAX,
    Place.TOP_P: Rule.FIRST,
    Place.ADVANTAGES: Rule.LAST,
    Place.CLIP_RANGE: Rule.FIRST,
    Place.SURROGATE: Rule.FIRST,
    Place.KL: Rule.SUM,
    Place.GATES: Rule.CHAIN,
    Place.REGULARISER: Rule.SUM,
}


def test_each_place_has_its_promised_rule_and_the_table_runs_in_the_steps_order():
    assert {place: rule.rule for place, rule in PLACES.items()} == PROMISED
    assert list(PLACES) == list(PROMISED)  # the clip bound is read by the surrogate: it comes before it


@pytest.mark.parametrize(
    ("rule", "expected"),
    [(Rule.FIRST, 3), (Rule.LAST, 5), (Rule.SUM, 10 + 3 + 5), (Rule.MAX, 10), (Rule.CHAIN, (10 - 3) * 5)],
)
def test_fold_applies_each_rule_to_two_answers_and_skips_a_none(rule, expected):
    asked = []

    def ask(answer):
        def given(value):
            asked.append(value)
            return answer

        return given

    apply = (lambda answer, value: (value - answer) if answer == 3 else value * answer) if rule is Rule.CHAIN else None
    assert fold(rule, [ask(None), ask(3), ask(None), ask(5)], 10, apply) == expected
    if rule is Rule.FIRST:
        assert len(asked) == 2  # the parts after the first answer are not asked
    if rule is Rule.CHAIN:
        assert asked == [10, 10, 7, 7]  # each part is given the value so far
    assert fold(rule, [ask(None)], 10) == 10


class FirstPart(MethodPart):
    key = "first"
    factor, offset = 2.0, 1.0

    def group_baseline(self, grouped_rewards):
        return torch.full(grouped_rewards.shape[:1], self.offset), {f"{self.key}/baseline": self.offset}

    def reject_rollouts(self, rewards, advantages, batch):
        return advantages * self.factor, {f"{self.key}/rejection": self.factor}

    def clamp_fraction(self):
        return 0.1 * self.factor

    def top_p_rule(self):
        return TopPRule(0.1 * self.factor, int(self.factor))

    def token_advantages(self, batch):
        return batch.group_advantages * self.factor, {f"{self.key}/advantages": self.factor}

    def clip_range(self):
        return (0.1 * self.factor, 0.1 * self.offset)

    def surrogate(self, batch, ratio, token_advantages):
        self.trainer.asked_surrogates.append(self.key)
        return ratio * token_advantages * self.factor, {f"{self.key}/surrogate": self.factor}

    def penalty(self, batch, ratio, token_advantages):
        return torch.full_like(ratio, self.offset), {f"{self.key}/penalty": self.offset}

    def gate(self, batch, ratio, token_advantages):
        return TokenGate(weight=torch.full_like(ratio, self.factor)), {f"{self.key}/gate": self.factor}

    def regulariser(self, batch):
        return batch.log_probs.new_tensor(self.offset), {f"{self.key}/regulariser": self.offset}


class SecondPart(FirstPart):
    key = "second"
    factor, offset = 3.0, 5.0


@pytest.fixture
def trainer(toy_model_path, toy_tokenizer, tmp_path):
    trainer = build_trainer("grpo", toy_model_path, toy_tokenizer, tmp_path, accumulation=2)
    trainer.parts = [FirstPart(trainer), SecondPart(trainer)]
    trainer.asked_surrogates = []
    return trainer


def micro_batch():
    log_probs = torch.tensor([[-0.5, -1.0, -2.0], [-0.1, -0.2, -0.3]])
    return CompletionBatch(
        log_probs=log_probs,
        old_log_probs=log_probs - 0.1,
        entropy=torch.ones(2, 3),
        clamped_entropy=None,
        mask=torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]),
        group_advantages=torch.tensor([[0.5], [-0.5]]),
    )


def test_the_generation_batch_places_take_the_last_baseline_and_chain_the_rejections(trainer):
    generations = trainer.num_generations
    rewards = torch.arange(generations, dtype=torch.float32)
    trainer.on_rewards(rewards.unsqueeze(1))
    trainer._metrics["train"].clear()
    batch = {
        "prompt_ids": torch.ones(generations, 1, dtype=torch.long),
        "prompt_mask": torch.ones(generations, 1, dtype=torch.long),
        "completion_ids": torch.ones(generations, 2, dtype=torch.long),
        "completion_mask": torch.ones(generations, 2, dtype=torch.long),
        "advantages": torch.zeros(generations),
    }
    output = trainer.finish_generation_batch(batch, rows=generations)
    # The second part's baseline (the last), then the first part's rejection, then the second's on its result.
    around = advantages_around_baseline(rewards, generations, trainer.scale_rewards, torch.tensor([5.0]))
    torch.testing.assert_close(output["advantages"], around * 2.0 * 3.0, rtol=0, atol=0)
    metrics = trainer._metrics["train"]
    assert [metrics[f"{key}/baseline"] for key in ("first", "second")] == [[1.0], [5.0]]  # both asked
    assert [metrics[f"{key}/rejection"] for key in ("first", "second")] == [[2.0], [3.0]]


def test_the_scoring_places_take_the_largest_clamp_and_the_first_top_p_rule(trainer):
    assert trainer.clamp_fraction() == pytest.approx(0.3)
    assert trainer.top_p_rule() == TopPRule(0.2, 2)


def test_the_loss_places_combine_by_their_rules(trainer):
    batch, metrics = micro_batch(), []
    token_advantages = trainer.token_advantages(batch, metrics)
    torch.testing.assert_close(token_advantages, batch.group_advantages * 3.0, rtol=0, atol=0)  # the last
    assert trainer.clip_range() == (pytest.approx(0.2), pytest.approx(0.1))  # the first
    ratio = trainer.ratio(batch)
    per_token = trainer.surrogate(batch, ratio, token_advantages, trainer.clip_range(), metrics)
    torch.testing.assert_close(per_token, ratio * token_advantages * 2.0, rtol=0, atol=0)  # the first
    assert trainer.asked_surrogates == ["first"]  # the second is not asked
    penalised = trainer.add_penalties(batch, ratio, token_advantages, per_token, metrics)
    torch.testing.assert_close(penalised, per_token + 1.0 + 5.0, rtol=0, atol=0)  # the sum
    gated = trainer.apply_gates(batch, ratio, token_advantages, penalised, {}, metrics)
    torch.testing.assert_close(gated, penalised * 2.0 * 3.0, rtol=0, atol=0)  # each gate on the one before
    loss = torch.tensor(0.25)
    regularised = trainer.add_regularisers(batch, loss, loss, None, metrics)
    assert regularised.item() == pytest.approx(0.25 + 1.0 / 2 + 5.0 / 2)  # the sum, each over the accumulation
    assert [name for name, _ in metrics] == [
        "first/advantages",
        "second/advantages",
        "first/surrogate",
        "first/penalty",
        "second/penalty",
        "first/gate",
        "second/gate",
        "first/regulariser",
        "second/regulariser",
    ]
