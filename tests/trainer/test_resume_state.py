"""Every registered method's state across two generation batches and a checkpoint, in the quick loop: a trainer driven
by hand through two generation cycles (two passes over each batch), saved and restored into a fresh trainer through the
checkpoint's own functions (`_support/checkpoint_files.py`), holds the same controllers and parts as the saved one,
and both go on alike. The runs that resume for real (tests/trainer/test_resume.py) train for the same facts."""

import pytest
import torch
from _support.checkpoint_files import resume_from_saved
from _support.distributed_run import method_options
from _support.grpo import build_trainer, make_grpo_batch, set_sync

from trl_entropy.methods import FIELD_OWNERS, METHODS


# Settings under which a method keeps state it keeps under no other: a previous cycle's entropy, a selection made once
# per generation batch; a case for each method whose config has the field.
STATEFUL_SETTINGS = {"entrocraft_entropy_source": "previous_cycle", "cov_selection_scope": "generation_batch"}
CASES = {name: (name, {}) for name in METHODS} | {
    f"{name}-{value}": (name, {field: value})
    for field, value in STATEFUL_SETTINGS.items()
    for name in FIELD_OWNERS[field]
}
REWARDS = ([1.0, 0.0, 0.5, 0.25], [0.0, 1.0, 0.75, 0.0], [0.25, 0.5, 1.0, 0.0])  # one group of four per batch
PASSES = 2


def trainer_for(case, model_path, tokenizer, output_dir):
    name, settings = CASES[case]
    options = method_options(name) | {"num_iterations": PASSES, "max_steps": 8} | settings
    trainer = build_trainer(name, model_path, tokenizer, output_dir, **options)
    trainer.state.max_steps = 8
    return trainer


def generation_cycle(trainer, tokenizer, index: int) -> list[float]:
    """One generation batch through the trainer's generation tail, then one loss step per pass over it, each an
    optimizer step (the last ends the cycle); the losses."""
    inputs = make_grpo_batch(trainer.model, len(tokenizer), seed=index)
    trainer.on_rewards(torch.tensor(REWARDS[index]).unsqueeze(1))
    inputs = trainer.finish_generation_batch(inputs, rows=len(REWARDS[index]))
    losses = []
    for _ in range(PASSES):
        set_sync(trainer, True)
        losses.append(trainer.compute_loss(trainer.model, dict(inputs)).item())
        trainer.state.global_step += 1
    return losses


def state(trainer) -> dict:
    """Everything the controllers and the parts hold (a random generator by its state)."""

    def value(held):
        return held.get_state().tolist() if isinstance(held, torch.Generator) else held

    def values(holder, leave_out=()):
        return {
            key: {k: value(v) for k, v in held.items()} if isinstance(held, dict) else value(held)
            for key, held in vars(holder).items()
            if key not in leave_out
        }

    return {
        "controllers": {name: values(controller) for name, controller in trainer.controllers.items()},
        "parts": {part.key: values(part, leave_out={"trainer"}) for part in trainer.parts},
    }


@pytest.mark.parametrize("case", CASES)
def test_a_checkpoint_after_two_generation_batches_restores_every_piece_of_state(
    case, warm_toy_policy_path, toy_tokenizer, tmp_path
):
    saved = trainer_for(case, warm_toy_policy_path, toy_tokenizer, tmp_path / "saved")
    for index in (0, 1):
        generation_cycle(saved, toy_tokenizer, index)
    resumed = trainer_for(case, warm_toy_policy_path, toy_tokenizer, tmp_path / "resumed")
    before = state(resumed)
    resume_from_saved(saved, resumed, str(tmp_path / f"checkpoint-{saved.state.global_step}"))
    assert state(resumed) == state(saved)
    if saved.controllers or saved.rank_checkpoint_state():
        assert state(saved) != before  # two cycles moved what the checkpoint carries: the comparison has power
    assert generation_cycle(resumed, toy_tokenizer, 2) == generation_cycle(saved, toy_tokenizer, 2)
