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
