"""The resume tests' run: a toy training of a few steps with sampled completions, ranked rewards and a checkpoint at
every step (``num_iterations = 2``: a generation cycle is two optimizer steps), and the check that a resumed run
continues the straight one exactly."""

import json
import os

import pytest
import torch

from _support.distributed_run import ControllerRecorder, logged, make_trainer, ranked_reward
from trl_entropy.core.control import EntropyControlState


STEPS = 4
CHECKPOINT = 1  # inside the first generation cycle (steps 1 and 2)


def train(method, path, output_dir, resume_from=None, max_steps=STEPS, per_device_train_batch_size=16, **options):
    trainer = make_trainer(
        method,
        path,
        output_dir,
        rollout=None,  # sampled completions
        reward=ranked_reward,  # advantages at every step, whatever is sampled
        per_device_train_batch_size=per_device_train_batch_size,
        num_iterations=2,
        max_steps=max_steps,
        save_strategy="steps",
        save_steps=1,
        **options,
    )
    recorder = ControllerRecorder.attached_to(trainer)
    trainer.train(resume_from_checkpoint=resume_from)
    return trainer, recorder.values


def step_values(trainer, key):
    """``{step: value}`` of a logged metric."""
    return {entry["step"]: entry[key] for entry in trainer.state.log_history if key in entry and "step" in entry}


def saved_snapshot(checkpoint):
    with open(os.path.join(checkpoint, "trainer_state.json")) as file:
        stateful = json.load(file)["stateful_callbacks"]
    return stateful[EntropyControlState.__name__]["attributes"]["snapshot"]


def assert_resumed_equals_straight(straight, straight_values, resumed, resumed_values, checkpoint=CHECKPOINT):
    CHECKPOINT = checkpoint  # noqa: N806 (the step resumed from)
    later = range(CHECKPOINT + 1, STEPS + 1)
    losses = step_values(straight, "loss")
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert len({losses[step] for step in later}) == len(later), "identical losses: the comparison would be weak"
    resumed_losses, resumed_entropy = step_values(resumed, "loss"), step_values(resumed, "entropy")
    for step in later:
        assert resumed_losses[step] == pytest.approx(losses[step], rel=1e-5, abs=1e-7), step
        assert resumed_entropy[step] == pytest.approx(step_values(straight, "entropy")[step], rel=1e-5), step
        assert step_values(resumed, "grad_norm")[step] == pytest.approx(
            step_values(straight, "grad_norm")[step], rel=1e-4, abs=1e-7
        ), step
    # The same samples (rewards are logged at the steps that generate).
    rewards = {step: value for step, value in step_values(straight, "reward").items() if step in later}
    assert rewards or all(step % 2 == 0 for step in later)  # a cycle is two steps; its first one generates
    assert {s: v for s, v in step_values(resumed, "reward").items() if s in later} == rewards
    # The resumed run records only its own steps; it continues the controller trajectory.
    assert len(straight_values) == STEPS and len(resumed_values) == STEPS - CHECKPOINT
    if straight.controllers:
        for resumed_value, straight_value in zip(resumed_values, straight_values[CHECKPOINT:], strict=True):
            assert resumed_value == pytest.approx(straight_value, rel=1e-6, abs=1e-12)
        for controller in straight.controllers.values():
            for key in controller.metrics():  # the logged values, the measured targets included
                for step in later:
                    assert step_values(resumed, key)[step] == pytest.approx(
                        step_values(straight, key)[step], rel=1e-6, abs=1e-12
                    ), (key, step)
    for (name, weight), resumed_weight in zip(
        straight.model.named_parameters(), resumed.model.parameters(), strict=True
    ):
        torch.testing.assert_close(resumed_weight, weight, rtol=1e-5, atol=1e-6, msg=name)
    assert logged(resumed, "loss")[:CHECKPOINT] == logged(straight, "loss")[:CHECKPOINT]  # history restored
