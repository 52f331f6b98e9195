"""Per-rank side files of a checkpoint: what one process holds that ``trainer_state.json`` cannot carry.

The base writes the buffered generation batch of a checkpoint taken inside a generation cycle
(``GENERATION_BATCH_FILE``); a method's part adds its own per-rank state through its ``rank_checkpoint_state()``
(Clip-Cov: its random generator) and reads it back in ``restore_rank_checkpoint_state(checkpoint)`` with
:func:`load_rank_file`. Every file is written into the checkpoint folder before ``transformers.Trainer``'s own save,
which pushes the folder to the Hub as its last step, so a pushed checkpoint holds them too.

A save starts by writing ``SAVING_MARKER`` into the folder and removes it once everything (Trainer's files and TRL's)
is written: a folder a kill interrupted keeps the marker (or lacks ``trainer_state.json``), and
:func:`last_complete_checkpoint` (``resume_from_checkpoint=True``) skips it with a warning.

The snapshot also records the method that wrote the checkpoint, its configuration (the method's fields and the batch
layout) and the layout of the generation cycle, so a resume with other settings warns (settings come from the new
config, learned state from the checkpoint), a resume with another method is refused (unless
``entropy_control_fresh_start``), and a buffered generation batch that no longer fits is regenerated.

A model with tied weights (the LM head tied to the input embedding) has the tied tensor saved once, so
transformers.Trainer would report the other name as a missing key on every resume, though loading the saved one
restores it through the tie: :func:`tied_weights_not_reported_missing` drops that report when it lists only such keys.
"""

import ast
import logging
import math
import os
import re
from contextlib import contextmanager
from dataclasses import fields

import torch
from accelerate.utils import send_to_device
from transformers import TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .config import EntropyGRPOBaseConfig
from .control import EntropyControlState
from .trl.noise import MISSING_KEYS_LOGGER, MISSING_KEYS_REPORT
from .warn import warn_user


# The buffered generation batch of a checkpoint taken inside a generation cycle, one file per process.
GENERATION_BATCH_FILE = "trl_entropy_generation_batch_{process_index}.pt"
# Present while a checkpoint is being written; a folder that still holds it was interrupted.
SAVING_MARKER = "trl_entropy_saving"
TRAINER_STATE = "trainer_state.json"
# TrainingArguments fields that shape the generation batch; every other field compared is a GRPOConfig (or method) one.
LAYOUT_FIELDS = ("per_device_train_batch_size", "gradient_accumulation_steps")


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


def cycle_open(trl_step: int, steps_per_generation: int, num_iterations: int) -> bool:
    """True when TRL's micro-batch counter ``trl_step`` is inside a generation cycle: the rest of the cycle trains on
    the buffered generation batch."""
    return trl_step % (steps_per_generation * num_iterations) != 0


def generation_cycle_open(trainer) -> bool:
    return cycle_open(trainer.micro_step, trainer.args.steps_per_generation, trainer.num_iterations)


def method_name(trainer) -> str:
    """The methods a trainer trains, as its config names them (``method_label``: their trainer class's name)."""
    return trainer.args.method_label


def run_settings(args) -> dict:
    """The settings a checkpoint records to compare on resume: GRPOConfig's and the selected methods' fields (JSON
    scalars; the methods themselves are compared by name), the batch layout, and ``max_steps`` where a selected
    method's config reads it (``reads_max_steps``)."""
    skip = {f.name for f in fields(TrainingArguments)} - set(LAYOUT_FIELDS) | {"entropy_control"}
    names = {f.name for f in fields(EntropyGRPOBaseConfig)}
    names |= {f.name for _, config_class in args.method_configs() for f in fields(config_class)}
    values = {name: getattr(args, name, None) for name in sorted(names) if name not in skip}
    if any(config_class.reads_max_steps(args) for _, config_class in args.method_configs()):
        values["max_steps"] = args.max_steps  # a schedule's clock runs to max_steps: a new one moves every later value
    return {
        name: value for name, value in values.items() if value is None or isinstance(value, (bool, int, float, str))
    }


def layout(trainer) -> dict:
    args = trainer.args
    return {
        "steps_per_generation": args.steps_per_generation,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "num_iterations": trainer.num_iterations,
        "num_processes": trainer.accelerator.num_processes,
    }


def restored_through_a_tie(model, missing: set[str]) -> set[str]:
    """The keys of ``missing`` whose parameter is tied to one under a key that is not missing (the LM head tied to the
    input embedding): loading that key restores them."""
    names_by_parameter: dict[int, set[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names_by_parameter.setdefault(id(parameter), set()).add(name)
    return {name for names in names_by_parameter.values() if names - missing for name in names & missing}


class TiedWeightsNotReportedMissing(logging.Filter):
    """Drops transformers.Trainer's "missing keys" report on resume when every key it lists is a tied weight restored
    through its tie: the weights file holds a tied tensor once, so the other name is always "missing". A report that
    lists any other key passes, as does every other record."""

    def __init__(self, trainer):
        super().__init__()
        self.trainer = trainer

    def filter(self, record: logging.LogRecord) -> bool:
        report = MISSING_KEYS_REPORT.fullmatch(record.getMessage())
        if report is None:
            return True
        missing = set(ast.literal_eval(report.group(1)))
        return missing != restored_through_a_tie(self.trainer.model, missing)


@contextmanager
def tied_weights_not_reported_missing(trainer):
    """While this is open, a resume of ``trainer`` does not report its tied weights as missing."""
    quiet = TiedWeightsNotReportedMissing(trainer)
    logger = logging.getLogger(MISSING_KEYS_LOGGER)
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def save_entropy_control(trainer, folder: str) -> None:
    """Put the entropy-control state of ``trainer`` into the checkpoint being written to ``folder``: the snapshot in
    ``trainer_state.json`` (through the stateful callback), this rank's buffered generation batch when the checkpoint
    is taken inside a generation cycle (a fresh trainer would regenerate it from the updated policy), and the method's
    per-rank state. Marks the folder as being written first (:func:`end_checkpoint` removes the mark)."""
    os.makedirs(folder, exist_ok=True)
    if trainer.accelerator.is_main_process:
        with open(os.path.join(folder, SAVING_MARKER), "w") as file:
            file.write("a save of this checkpoint started and has not finished\n")
    state = trainer._entropy_control_state
    state.snapshot = {
        **trainer.controller_cycle.snapshot(),
        "trl_step": trainer.micro_step,  # where the buffered generation batch is in its cycle
        "num_processes": trainer.accelerator.num_processes,
        "method": method_name(trainer),
        "settings": run_settings(trainer.args),
        "layout": layout(trainer),
    }
    trainer.state.stateful_callbacks[EntropyControlState.__name__] = state.state()  # Trainer updates known keys only
    rank = trainer.accelerator.process_index
    if generation_cycle_open(trainer):
        save_rank_file(folder, GENERATION_BATCH_FILE, rank, trainer.buffered_generation_batch)
    for pattern, value in trainer.rank_checkpoint_state().items():
        save_rank_file(folder, pattern, rank, value)


def end_checkpoint(trainer, folder: str) -> None:
    """Mark ``folder`` complete, once every rank has written its part."""
    trainer.accelerator.wait_for_everyone()
    marker = os.path.join(folder, SAVING_MARKER)
    if trainer.accelerator.is_main_process and os.path.exists(marker):
        os.remove(marker)


def incomplete_reason(folder: str) -> str | None:
    if os.path.exists(os.path.join(folder, SAVING_MARKER)):
        return f"its save was interrupted ({SAVING_MARKER} is still there)"
    if not os.path.exists(os.path.join(folder, TRAINER_STATE)):
        return f"it has no {TRAINER_STATE}"
    return None


def last_complete_checkpoint(output_dir: str) -> str:
    """The latest checkpoint folder of ``output_dir`` whose save finished; interrupted ones are skipped, each with a
    warning that names it."""
    pattern = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
    found = [] if not os.path.isdir(output_dir) else os.listdir(output_dir)
    steps = sorted((int(m.group(1)), name) for name in found if (m := pattern.match(name)))
    for _, name in reversed(steps):
        folder = os.path.join(output_dir, name)
        if not os.path.isdir(folder):
            continue
        reason = incomplete_reason(folder)
        if reason is None:
            return folder
        warn_user(f"skipping the incomplete checkpoint {folder}: {reason}")
    raise ValueError(f"No valid checkpoint found in output directory ({output_dir}): no complete checkpoint folder")


def same(old, new) -> bool:
    both_nan = isinstance(old, float) and isinstance(new, float) and math.isnan(old) and math.isnan(new)
    return old == new or both_nan


def warn_changed_settings(trainer, checkpoint: str, stored: dict) -> None:
    """One warning listing every setting whose value differs from the checkpoint's, ``old → new``."""
    current = run_settings(trainer.args)
    changed = [
        f"{name}: {stored.get(name, '(absent)')!r} → {current.get(name, '(absent)')!r}"
        for name in sorted(set(stored) | set(current))
        if not same(stored.get(name, "(absent)"), current.get(name, "(absent)"))
    ]
    if changed:
        warn_user(
            f"resuming {checkpoint} with settings that differ from the checkpoint's; the new values apply, the "
            f"learned state (coefficients, measured targets) comes from the checkpoint: {'; '.join(changed)}"
        )


def refuse_other_method(trainer, checkpoint: str, written_by: str) -> None:
    raise ValueError(
        f"{checkpoint} was written by {written_by}; resuming it with {method_name(trainer)} would drop or invent "
        f"controller state. To start {method_name(trainer)}'s controllers fresh from that checkpoint's weights on "
        "purpose, set entropy_control_fresh_start=True in the config (docs/distributed.md, Resuming)."
    )


def start_new_cycle(trainer, reason: str | None) -> None:
    """Drop the buffered generation batch and the partial cycle: the next step generates anew (as TRL does)."""
    trainer.micro_step, trainer.buffered_generation_batch = 0, None
    trainer.controller_cycle.start_cycle()
    if reason is not None:
        warn_user(
            f"{reason}: the buffered generation batch and the partial cycle statistics are discarded and the "
            "generation batch is regenerated from the resumed policy, so this run will differ from a straight one"
        )


def restore_entropy_control(trainer, checkpoint: str) -> None:
    """Take the entropy-control state of ``checkpoint`` over into ``trainer`` (after Trainer loaded its own state)."""
    stored = trainer.state.stateful_callbacks.get(EntropyControlState.__name__) or {}
    snapshot = stored.get("attributes", {}).get("snapshot")
    controllers = trainer.controllers
    fresh = trainer.args.entropy_control_fresh_start
    if snapshot is None:
        if controllers and not fresh:
            raise ValueError(
                f"{checkpoint} holds no entropy-control state (trainer_state.json, stateful_callbacks."
                f"{EntropyControlState.__name__}), so resuming {type(trainer).__name__} would restart the "
                f"controllers {sorted(controllers)} from their initial values. Set entropy_control_fresh_start=True "
                "to do so on purpose."
            )
        return
    written_by = snapshot.get("method")
    if (written_by is not None and written_by != method_name(trainer)) or set(snapshot["controllers"]) != set(
        controllers
    ):
        written_by = written_by or f"a trainer with the controllers {sorted(snapshot['controllers'])}"
        if not fresh:
            refuse_other_method(trainer, checkpoint, written_by)
        start_new_cycle(trainer, None)
        warn_user(f"{checkpoint} was written by {written_by}: {method_name(trainer)} starts fresh")
        return
    if "settings" in snapshot:
        warn_changed_settings(trainer, checkpoint, snapshot["settings"])
    accelerator = trainer.accelerator
    trainer.controller_cycle.restore(snapshot, keep_sums=accelerator.is_main_process, device=accelerator.device)
    trainer.micro_step = snapshot["trl_step"]
    new_layout = layout(trainer)
    old_layout = snapshot.get("layout", new_layout)
    if old_layout != new_layout:
        old_open = cycle_open(snapshot["trl_step"], old_layout["steps_per_generation"], old_layout["num_iterations"])
        changed = ", ".join(f"{k}: {v} → {new_layout[k]}" for k, v in old_layout.items() if v != new_layout[k])
        start_new_cycle(
            trainer,
            f"{checkpoint} was saved inside a generation cycle and the layout changed ({changed})"
            if old_open
            else None,
        )
    elif generation_cycle_open(trainer):
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
        trainer.buffered_generation_batch = buffered
    trainer.restore_rank_checkpoint_state(checkpoint)
