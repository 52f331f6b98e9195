"""Reading a run's log: the ``log_history`` of its ``trainer_state.json`` (the folder's own or its latest
checkpoint's), the entropy-collapse demo's folders as their runs, and the series the report draws from it."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np


TRAINER_STATE = "trainer_state.json"
CHECKPOINT = re.compile(r"checkpoint-(\d+)")
PASS_AT_K = re.compile(r"eval/pass@(\d+)")
ENTROPY, REWARD = "entropy", "reward"
# The keys EntropyLawCallback logs: its last values are quoted next to the report's own fit.
LOGGED_LAW = ("entropy/law_a", "entropy/law_b", "entropy/predicted_ceiling")


def controller_panels() -> tuple:
    """The panels of the values the methods log, one per metric with a title in a method's declaration
    (``trl_entropy.methods.spec.Metric``: ``key``, ``title``, ``ylabel``, ``smooth``), in the registry's order."""
    from trl_entropy.methods import SPECS  # the registry imports TRL's trainers: only once there is a report to draw

    return tuple(metric for spec in SPECS for metric in spec.metrics if metric.title)


def entropy_targets() -> dict[str, str]:
    """The entropy targets the methods log (metric -> label): drawn dashed on the entropy panel."""
    from trl_entropy.methods import SPECS

    return {metric.key: metric.target_label for spec in SPECS for metric in spec.metrics if metric.target_label}


class RunLogError(ValueError):
    """A run folder without a readable log history."""


class DemoFolderError(RunLogError):
    """The entropy-collapse demo's output folder holding several seeds: the message names each seed's folder."""


@dataclass
class RunLog:
    """One run: its name (the folder), the ``trainer_state.json`` read, and its ``log_history``."""

    name: str
    folder: Path
    source: Path
    history: list[dict]

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, values)`` of every log entry holding a finite number under ``key``."""
        steps, values = [], []
        for index, entry in enumerate(self.history):
            value = entry.get(key)
            if is_number(value) and math.isfinite(value):
                steps.append(entry.get("step", index))
                values.append(float(value))
        return np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)

    def has(self, key: str) -> bool:
        return self.series(key)[1].size > 0

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """``(entropies, rewards)`` of the entries that hold both (what the law is fitted on)."""
        entropies, rewards = [], []
        for entry in self.history:
            entropy, reward = entry.get(ENTROPY), entry.get(REWARD)
            if is_number(entropy) and is_number(reward) and math.isfinite(entropy) and math.isfinite(reward):
                entropies.append(float(entropy))
                rewards.append(float(reward))
        return np.asarray(entropies, dtype=np.float64), np.asarray(rewards, dtype=np.float64)

    def pass_at_k(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """``{k: (steps, values)}`` of every ``eval/pass@k`` logged."""
        ks = sorted(
            {int(match.group(1)) for entry in self.history for key in entry if (match := PASS_AT_K.fullmatch(key))}
        )
        return {k: self.series(f"eval/pass@{k}") for k in ks if self.has(f"eval/pass@{k}")}


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _global_step(path: Path) -> int:
    with open(path) as file:
        return int(json.load(file).get("global_step") or 0)


def find_trainer_state(run_dir: str | os.PathLike) -> Path:
    """The ``trainer_state.json`` to read for ``run_dir``: the folder's own (``trainer.save_state()``) or its latest
    checkpoint's (``checkpoint-N/``), whichever has the higher ``global_step`` (the folder's own on a tie).
    ``run_dir`` may also be a checkpoint folder or the JSON file itself. RunLogError names what was looked for."""
    path = Path(run_dir)
    if path.is_file():
        return path
    if not path.is_dir():
        raise RunLogError(
            f"{path}: no such folder (give the run's output_dir, a checkpoint folder or a {TRAINER_STATE})"
        )
    candidates = []
    checkpoints = [
        (int(match.group(1)), child / TRAINER_STATE)
        for child in path.iterdir()
        if (match := CHECKPOINT.fullmatch(child.name)) and (child / TRAINER_STATE).is_file()
    ]
    if checkpoints:
        candidates.append(max(checkpoints)[1])
    if (path / TRAINER_STATE).is_file():
        candidates.append(path / TRAINER_STATE)
    if not candidates:
        raise RunLogError(
            f"{path}: no log history: looked for {path / TRAINER_STATE} and {path / 'checkpoint-*' / TRAINER_STATE}, "
            "found neither. The Trainer writes it with every checkpoint (save_strategy) and on trainer.save_state()."
        )
    # max() keeps the first of equal keys: the folder's own file is last, so sort it first on a tie.
    return max(reversed(candidates), key=_global_step)


SEED_FOLDER = re.compile(r"seed(\d+)")
PHASE_FOLDER = re.compile(r"phase(\d+)")
DEMO_START = "start"


def _has_trainer_state(path: Path) -> bool:
    return (path / TRAINER_STATE).is_file() or any(
        CHECKPOINT.fullmatch(child.name) and (child / TRAINER_STATE).is_file() for child in path.iterdir()
    )


def _phase_folders(path: Path) -> dict[int, Path]:
    """``{phase: folder}`` of a demo run's folder (``<run>/phase1``, ``<run>/phase2``) that hold a log."""
    return {
        int(match.group(1)): child
        for child in sorted(path.iterdir())
        if child.is_dir() and (match := PHASE_FOLDER.fullmatch(child.name)) and (child / TRAINER_STATE).is_file()
    }


def _demo_run_order(seed_folder: Path, names: list[str]) -> list[str]:
    """The runs in the demo's order (its history.json, one folder up), else by name."""
    try:
        with open(seed_folder.parent / "history.json") as file:
            order = list(json.load(file)["runs"])
    except (OSError, ValueError, KeyError, TypeError):
        return sorted(names)
    return [name for name in order if name in names] + sorted(set(names) - set(order))


def expand_demo_folders(run_dirs) -> tuple[list[Path], list[str]]:
    """The run folders to read for ``run_dirs``, with a line per expansion: a folder with a log is itself; a folder
    written by the entropy-collapse demo (``trl-entropy demo``) is its runs (each ``trainer_state.json`` holds the
    run's log and its held-out ``eval/pass@k``):

    * one seed's folder (``outputs/demo/seed0``): that seed's phase-1 runs and the start policy's evaluation;
    * the demo's folder (``outputs/demo``) holding one seed: that seed's, as above; holding several:
      DemoFolderError naming each seed's folder to pass;
    * one run's folder (``outputs/demo/seed0/grpo``): its phases.

    Any other folder is left as it is (read_run then says what it lacks)."""
    folders, notes = [], []
    for run_dir in run_dirs:
        path = Path(run_dir)
        if not path.is_dir() or _has_trainer_state(path):
            folders.append(path)
            continue
        seeds = sorted(
            (int(match.group(1)), child)
            for child in path.iterdir()
            if child.is_dir() and (match := SEED_FOLDER.fullmatch(child.name))
        )
        if len(seeds) > 1:
            listed = ", ".join(str(folder) for _, folder in seeds)
            raise DemoFolderError(
                f"{path} holds the entropy-collapse demo's runs of {len(seeds)} seeds; the report overlays one "
                f"seed's runs: pass one of {listed} (e.g. trl-entropy report {seeds[0][1]})"
            )
        if len(seeds) == 1:
            path = seeds[0][1]
        phases = _phase_folders(path)
        if phases:  # one demo run: its phases
            folders += list(phases.values())
            notes.append(f"{path}: the demo run's phases {', '.join(f'phase{phase}' for phase in phases)}")
            continue
        runs = {child.name: _phase_folders(child) for child in path.iterdir() if child.is_dir()}
        names = _demo_run_order(path, [name for name, phases in runs.items() if 1 in phases])
        if not names:
            folders.append(path)
            continue
        start = path / DEMO_START
        if (start / TRAINER_STATE).is_file():
            folders.append(start)
        folders += [runs[name][1] for name in names]
        note = f"{path}: the demo's phase-1 runs ({', '.join(names)})"
        if (start / TRAINER_STATE).is_file():
            note += " and the start policy's evaluation (start)"
        if any(2 in runs[name] for name in names):
            note += f"; for phase 2 (task B) pass {path / '*' / 'phase2'}"
        notes.append(note)
    return folders, notes


def read_run(run_dir: str | os.PathLike, name: str | None = None) -> RunLog:
    """The log history of ``run_dir`` (see :func:`find_trainer_state`); RunLogError when it has none."""
    source = find_trainer_state(run_dir)
    try:
        with open(source) as file:
            state = json.load(file)
    except (OSError, json.JSONDecodeError) as error:
        raise RunLogError(f"{source}: not a readable trainer state ({error})") from error
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list) or not any(isinstance(entry, dict) for entry in history):
        raise RunLogError(
            f"{source}: no log history (its 'log_history' is missing or empty; the Trainer logs every logging_steps "
            "optimizer steps)"
        )
    folder = Path(run_dir) if Path(run_dir).is_dir() else source.parent
    return RunLog(
        name or folder.resolve().name, folder, source, [entry for entry in history if isinstance(entry, dict)]
    )


def run_names(folders: list[Path]) -> list[str]:
    """Each folder's name; where two share one, as many parent folders as make them differ."""
    parts = [folder.resolve().parts for folder in folders]
    depth = 1
    while depth < max(len(p) for p in parts):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
        depth += 1
    return ["/".join(p[-depth:]) for p in parts]


def value_at(curve, step) -> float:
    """The value a ``(steps, values)`` series logged at ``step`` (the last one logged there), NaN if none."""
    steps, values = curve
    matches = np.nonzero(steps == step)[0]
    return float(values[matches[-1]]) if matches.size else math.nan


def moving_average(values, window: int) -> list[float]:
    """Trailing moving average over ``window`` values (the first ones average the values seen so far)."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    averaged, total = [], 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        averaged.append(total / min(index + 1, window))
    return averaged


def default_window(num_points: int) -> int:
    """A tenth of the points, at least 1."""
    return max(1, num_points // 10)


def smoothing_window(run: RunLog, smoothing: int | None) -> int:
    """``smoothing`` when given, else a tenth of the run's entropy or reward points."""
    if smoothing is not None:
        return smoothing
    return default_window(max(run.series(ENTROPY)[1].size, run.series(REWARD)[1].size, 1))
