"""A checkpoint's entropy-control state carried from one trainer to another through the library's own save and restore
functions, without training: the quick loop's check of what a resumed run keeps (the runs that resume for real are in
the training tier)."""

import json

from trl_entropy.core.checkpoint import restore_entropy_control, save_entropy_control


def resume_from_saved(saved, resumed, checkpoint: str) -> None:
    """Save ``saved``'s entropy-control state into the folder ``checkpoint`` as a checkpoint save does, then restore it
    into ``resumed`` as a resume does, after transformers.Trainer has read back its own state: the optimizer step and
    ``trainer_state.json``'s stateful callbacks (through JSON, as the file holds them)."""
    save_entropy_control(saved, checkpoint)
    resumed.state.global_step = saved.state.global_step
    resumed.state.stateful_callbacks = json.loads(json.dumps(saved.state.stateful_callbacks))
    restore_entropy_control(resumed, checkpoint)
