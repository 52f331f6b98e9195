"""Methods combined, as runs: one with the other method neutral equals the single method's trainer; three combinations
resume mid-cycle exactly, every controller in the checkpoint; the run report draws every method's panels; the model
card names every method and cites every paper; each method's controller moves as it does alone."""

import itertools

import pytest
import torch
from _support.grpo import loss_and_gradients, make_grpo_batch
from _support.resume import CHECKPOINT, assert_resumed_equals_straight, saved_snapshot, train

from trl_entropy import EntropyGRPOConfig, EntropyGRPOTrainer
from trl_entropy.methods import METHODS, Neutral, combination
from trl_entropy.methods.compose import controls_entropy
from trl_entropy.report import write_report


NAMES = [name for name, entry in METHODS.items() if controls_entropy(entry)]
VALID = []
for pair in itertools.combinations(NAMES, 2):
    try:
        combination(list(pair))
    except ValueError:  # the refused pairs: tests/compose/test_pairs.py
        continue
    VALID.append(pair)
# QAE's quantile is never the mean, and ADAPO refuses the neutral clip of 1000 (outside its box): those pairs
# neutralise the other method. TRL's bonus is neutral at entropy_coef 0 (its registry entry's neutral settings match
# TRL's bonus instead, which the other methods refuse beside them alone).
NOT_NEUTRALISED = {"qae"}
NEUTRAL = {
    name: Neutral(ours=entry.neutral.ours, trl=entry.neutral.trl_options(ppo_clip=True))
    for name, entry in METHODS.items()
}
NEUTRAL["entreg"] = Neutral(ours={"entropy_coef": 0.0})


def neutralised(pair):
    """``(kept, neutralised)``: the second method neutralised where it can be, else the first."""
    first, second = pair
    if second in NOT_NEUTRALISED or (first == "adapo" and "epsilon" in NEUTRAL[second].ours):
        return second, first
    return first, second


@pytest.mark.filterwarnings("ignore:.*on-policy")
@pytest.mark.parametrize("pair", VALID, ids="+".join)
def test_a_combination_with_one_method_neutral_equals_the_other_alone(pair, toy_tokenizer, toy_trainer_of):
    kept, neutral = neutralised(pair)
    settings = dict(loss_type="dapo", epsilon_high=0.28, **METHODS[kept].defaults)
    single = toy_trainer_of(kept, "alone", **settings | NEUTRAL[neutral].trl)
    combined_entry = combination(list(pair))
    # The base trainer with entropy_control: it becomes the combination's trainer.
    combined = toy_trainer_of(
        (EntropyGRPOTrainer, EntropyGRPOConfig),
        "combined",
        entropy_control=list(pair),
        **{**settings, **METHODS[neutral].defaults, **NEUTRAL[neutral].ours},
    )
    assert type(combined) is combined_entry.trainer_class and type(single) is METHODS[kept].trainer_class
    inputs = make_grpo_batch(single.model, len(toy_tokenizer), seed=5)
    single_loss, single_grads = loss_and_gradients(single, inputs)
    combined_loss, combined_grads = loss_and_gradients(combined, inputs)
    torch.testing.assert_close(combined_loss, single_loss, rtol=1e-6, atol=1e-8)
    assert any(g.abs().max() > 0 for g in single_grads.values())
    for name, expected in single_grads.items():
        torch.testing.assert_close(combined_grads[name], expected, rtol=1e-5, atol=1e-8, msg=name)


# The combinations the papers' authors run or the issue names: an advantage change with a surrogate or a gate, and a
# regulariser with a moving clip bound (two controllers).
RESUMED = ["qae+kl_cov", "aent+adapo", "repo_r+clip_cov"]
CONTROLLERS = {"qae+kl_cov": set(), "aent+adapo": {"aent", "adapo"}, "repo_r+clip_cov": {"repo"}}


@pytest.fixture(scope="module")
def resumed_runs(warm_toy_policy_path, tmp_path_factory):
    runs = {}
    for method in RESUMED:
        root = tmp_path_factory.mktemp(method.replace("+", "_"))
        straight, straight_values = train(method, warm_toy_policy_path, str(root / "straight"))
        checkpoint = str(root / "straight" / f"checkpoint-{CHECKPOINT}")
        resumed, resumed_values = train(method, warm_toy_policy_path, str(root / "resumed"), resume_from=checkpoint)
        runs[method] = (root, straight, straight_values, resumed, resumed_values, checkpoint)
    return runs


@pytest.mark.parametrize("method", RESUMED)
def test_a_combination_resumes_mid_cycle_exactly_with_every_controller(method, resumed_runs):
    root, straight, straight_values, resumed, resumed_values, checkpoint = resumed_runs[method]
    assert type(straight) is combination(method.split("+")).trainer_class
    assert_resumed_equals_straight(straight, straight_values, resumed, resumed_values)
    snapshot = saved_snapshot(checkpoint)
    assert set(snapshot["controllers"]) == set(straight.controllers) == CONTROLLERS[method]
    for name, controller in straight.controllers.items():  # each ends where the straight run's ends
        assert resumed.controllers[name].state_dict() == pytest.approx(controller.state_dict(), rel=1e-6)


@pytest.mark.parametrize("method", RESUMED)
def test_the_report_draws_every_methods_panels(method, resumed_runs):
    root = resumed_runs[method][0]
    report = write_report(root / "straight")
    titled = [metric.title for name in method.split("+") for metric in METHODS[name].metrics if metric.title]
    logged = {key for entry in resumed_runs[method][1].state.log_history for key in entry}
    drawn = [metric.title for name in method.split("+") for metric in METHODS[name].metrics if metric.key in logged]
    assert {title for title in report.panels if title in titled} == {title for title in titled if title in drawn}
    assert drawn, "no method metric logged: the check would pass on nothing"


def test_the_model_card_names_every_method_and_cites_every_paper(resumed_runs):
    straight = resumed_runs["qae+kl_cov"][1]
    straight.create_model_card()
    card = (resumed_runs["qae+kl_cov"][0] / "straight" / "README.md").read_text()
    for name in ("qae", "kl_cov"):
        paper = METHODS[name].paper
        assert f"{METHODS[name].name} (arXiv:{paper.arxiv_id})" in card
        assert paper.bibtex in card
        assert METHODS[name].tag in card
    assert "DeepSeekMath" in card  # GRPO's own citation stays


# A method whose controller moves, beside another made neutral: its trajectory over a training run is its own alone.
ALONGSIDE = [("aent", "erc"), ("repo_r", "clip_cov"), ("entropic", "ent_adv")]


@pytest.mark.filterwarnings("ignore:.*on-policy")
@pytest.mark.parametrize(("kept", "neutral"), ALONGSIDE, ids=["+".join(pair) for pair in ALONGSIDE])
def test_each_controller_moves_as_it_does_alone(kept, neutral, warm_toy_policy_path, tmp_path):
    options = NEUTRAL[neutral].ours
    alone, alone_values = train(kept, warm_toy_policy_path, str(tmp_path / "alone"))
    both, both_values = train(f"{kept}+{neutral}", warm_toy_policy_path, str(tmp_path / "both"), **options)
    assert len(set(alone_values)) > 1, "the controller never moved: the check would be weak"
    assert both_values == pytest.approx(alone_values, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize(("other", "resumed_by"), [("qae", "QAETrainer"), ("aent+adapo", "Trainer[adapo+aent]")])
def test_resuming_with_another_set_of_methods_is_refused_unless_fresh_start(
    other, resumed_by, resumed_runs, warm_toy_policy_path, tmp_path
):
    """One of its methods alone, or other methods combined: the rule for another method (docs/distributed.md)."""
    checkpoint = resumed_runs["qae+kl_cov"][5]
    with pytest.raises(ValueError, match="entropy_control_fresh_start") as error:
        train(other, warm_toy_policy_path, str(tmp_path / "refused"), resume_from=checkpoint, max_steps=3)
    assert "Trainer[qae+kl_cov]" in str(error.value) and resumed_by in str(error.value)
    with pytest.warns(UserWarning, match="starts fresh"):
        resumed, _ = train(
            other,
            warm_toy_policy_path,
            str(tmp_path / "fresh"),
            resume_from=checkpoint,
            max_steps=3,
            entropy_control_fresh_start=True,
        )
    assert resumed.state.global_step == 3
