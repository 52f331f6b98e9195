"""Resume: N steps straight equal N/2 steps, a checkpoint, and N/2 more steps resumed from it, for every trainer.

The runs sample their completions from the policy (no fixed rollout), so the resumed run also has to restore the data
order and the random state; the methods' own state (controllers, Clip-Cov's selection generator, TRL's adaptive
entropy coefficient) comes back from the checkpoint.
"""

import json
import os

import pytest
import torch
from distributed_run import ControllerRecorder, logged, make_trainer

from trl_entropy.base import CONTROLLER_STATE_FILE
from trl_entropy.methods import METHODS


STEPS = 4
# TRL's own adaptive entropy bonus has state of its own (coefficient, last entropy) in TRL's checkpoint file.
CASES = [(name, {}) for name in sorted(METHODS)] + [
    (
        "entreg",
        {"use_adaptive_entropy": True, "entropy_coef": 0.01, "entropy_target": 0.7, "entropy_coef_delta": 0.005},
    )
]
IDS = [name if not options else f"{name}-adaptive" for name, options in CASES]


def train(method, path, output_dir, resume_from=None, **options):
    trainer = make_trainer(
        method,
        path,
        output_dir,
        rollout=None,  # sampled completions
        max_steps=STEPS,
        save_strategy="steps",
        save_steps=STEPS // 2,
        **options,
    )
    recorder = ControllerRecorder()
    recorder.trainer = trainer
    trainer.add_callback(recorder)
    trainer.train(resume_from_checkpoint=resume_from)
    return trainer, recorder.values


def step_values(trainer, key):
    """``{step: value}`` of a logged metric."""
    return {entry["step"]: entry[key] for entry in trainer.state.log_history if key in entry and "step" in entry}


@pytest.mark.parametrize("method, options", CASES, ids=IDS)
def test_resumed_run_equals_straight_run(method, options, warm_toy_policy_path, tmp_path):
    straight, straight_values = train(method, warm_toy_policy_path, str(tmp_path / "straight"), **options)
    checkpoint = str(tmp_path / "straight" / f"checkpoint-{STEPS // 2}")
    resumed, resumed_values = train(
        method, warm_toy_policy_path, str(tmp_path / "resumed"), resume_from=checkpoint, **options
    )

    losses = step_values(straight, "loss")
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert len(set(losses.values())) == STEPS, "identical losses: the comparison would be weak"
    resumed_losses = step_values(resumed, "loss")
    for step in range(STEPS // 2 + 1, STEPS + 1):
        assert resumed_losses[step] == pytest.approx(losses[step], rel=1e-5, abs=1e-7), step
        assert step_values(resumed, "entropy")[step] == pytest.approx(step_values(straight, "entropy")[step], rel=1e-5)

    # The same samples (rewards are logged at the steps that generate).
    later = range(STEPS // 2 + 1, STEPS + 1)
    rewards = {step: value for step, value in step_values(straight, "reward").items() if step in later}
    assert rewards and {s: v for s, v in step_values(resumed, "reward").items() if s in later} == rewards

    # The resumed run only records its own steps; it continues from the checkpointed controller value.
    assert len(straight_values) == STEPS and len(resumed_values) == STEPS // 2
    if straight.controllers:
        assert resumed_values == pytest.approx(straight_values[STEPS // 2 :], rel=1e-6, abs=1e-12)
        (name,) = straight.controllers
        with open(os.path.join(checkpoint, CONTROLLER_STATE_FILE)) as file:
            saved = json.load(file)[name]
        assert set(saved) == set(straight.controllers[name].state_dict())
        assert len(set(straight_values)) > 1 or method == "repo_d", f"{method}'s controller never moved"
    if options.get("use_adaptive_entropy"):
        assert step_values(resumed, "entropy_coef")[STEPS] == pytest.approx(
            step_values(straight, "entropy_coef")[STEPS]
        )
        assert resumed.entropy_coef == pytest.approx(straight.entropy_coef)

    for (name, weight), resumed_weight in zip(
        straight.model.named_parameters(), resumed.model.parameters(), strict=True
    ):
        torch.testing.assert_close(resumed_weight, weight, rtol=1e-5, atol=1e-6, msg=name)
    assert logged(resumed, "loss")[: STEPS // 2] == logged(straight, "loss")[: STEPS // 2]  # history restored
