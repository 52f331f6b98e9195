"""Per-rank side files of a checkpoint: what one process holds that ``trainer_state.json`` cannot carry.

The base writes the buffered generation batch of a checkpoint taken inside a generation cycle
(``GENERATION_BATCH_FILE``); a method adds its own per-rank state through the trainer's ``rank_checkpoint_state()``
hook (Clip-Cov: its random generator) and reads it back in ``restore_rank_checkpoint_state(checkpoint)`` with
:func:`load_rank_file`. Every file is written into the checkpoint folder before ``transformers.Trainer``'s own save,
which pushes the folder to the Hub as its last step, so a pushed checkpoint holds them too.
"""

import os

import torch
from accelerate.utils import send_to_device
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .control import EntropyControlState


# The buffered generation batch of a checkpoint taken inside a generation cycle, one file per process.
GENERATION_BATCH_FILE = "trl_entropy_generation_batch_{process_index}.pt"


def checkpoint_folder(output_dir: str, global_step: int) -> str:
    """The folder ``transformers.Trainer`` saves the checkpoint of ``global_step`` into."""
    return os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{global_step}")


def rank_file(folder: str, pattern: str, process_index: int) -> str:
    return os.path.join(folder, pattern.format(process_index=process_index))


def save_rank_file(folder: str, pattern: str, process_index: int, value) -> None:
    """Write this rank's ``value`` (anything ``torch.save`` takes) as ``pattern`` in ``folder``."""
    os.makedirs(folder, exist_ok=True)
    torch.save(value, rank_file(folder, pattern, process_index))


def load_rank_file(checkpoint: str, pattern: str, process_index: int, device=None):
    """This rank's file ``pattern`` of ``checkpoint``, moved to ``device``; None when the file is missing."""
    path = rank_file(checkpoint, pattern, process_index)
    if not os.path.exists(path):
        return None
    # Loaded on the CPU first: torch.load cannot map onto an indexed CPU device ("cpu:0", multi-process CPU).
    value = torch.load(path, map_location="cpu", weights_only=True)
    return value if device is None else send_to_device(value, device)


def generation_cycle_open(trainer) -> bool:
    """True inside a generation cycle: the rest of it trains on the buffered generation batch."""
    return trainer._step % (trainer.args.steps_per_generation * trainer.num_iterations) != 0


def save_entropy_control(trainer, folder: str) -> None:
    """Put the entropy-control state of ``trainer`` into the checkpoint being written to ``folder``: the snapshot in
    ``trainer_state.json`` (through the stateful callback), this rank's buffered generation batch when the checkpoint
    is taken inside a generation cycle (a fresh trainer would regenerate it from the updated policy), and the method's
    per-rank state."""
    state = trainer._entropy_control_state
    state.snapshot = {
        **trainer.controller_cycle.snapshot(),
        "trl_step": trainer._step,  # TRL's micro-batch counter: where the buffered generation batch is in its cycle
        "num_processes": trainer.accelerator.num_processes,
    }
    trainer.state.stateful_callbacks[EntropyControlState.__name__] = state.state()  # Trainer updates known keys only
    rank = trainer.accelerator.process_index
    if generation_cycle_open(trainer):
        save_rank_file(folder, GENERATION_BATCH_FILE, rank, trainer._buffered_inputs)
    for pattern, value in trainer.rank_checkpoint_state().items():
        save_rank_file(folder, pattern, rank, value)


def restore_entropy_control(trainer, checkpoint: str) -> None:
    """Take the entropy-control state of ``checkpoint`` over into ``trainer`` (after Trainer loaded its own state)."""
    stored = trainer.state.stateful_callbacks.get(EntropyControlState.__name__) or {}
    snapshot = stored.get("attributes", {}).get("snapshot")
    controllers = trainer.controllers
    if snapshot is None:
        if controllers:
            raise ValueError(
                f"{checkpoint} holds no entropy-control state (trainer_state.json, stateful_callbacks."
                f"{EntropyControlState.__name__}), so resuming {type(trainer).__name__} would restart the "
                f"controllers {sorted(controllers)} from their initial values"
            )
        return
    missing = sorted(set(controllers) - set(snapshot["controllers"]))
    if missing:
        raise ValueError(f"{checkpoint} holds no state for the controllers {missing}")
    accelerator = trainer.accelerator
    trainer.controller_cycle.restore(snapshot, keep_sums=accelerator.is_main_process, device=accelerator.device)
    trainer._step = snapshot["trl_step"]
    if generation_cycle_open(trainer):
        rank = accelerator.process_index
        buffered = None
        if snapshot["num_processes"] == accelerator.num_processes:
            buffered = load_rank_file(checkpoint, GENERATION_BATCH_FILE, rank, accelerator.device)
        if buffered is None:
            raise ValueError(
                f"{checkpoint} was saved inside a generation cycle by {snapshot['num_processes']} processes; "
                f"resuming it needs {GENERATION_BATCH_FILE.format(process_index=rank)} there and as many "
                f"processes (this run has {accelerator.num_processes})"
            )
        trainer._buffered_inputs = buffered
    trainer.restore_rank_checkpoint_state(checkpoint)
