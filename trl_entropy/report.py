"""Pictures of your own run: ``trl-entropy report RUN_DIR [RUN_DIR ...]``.

Reads the log history (``log_history`` of ``trainer_state.json``) of any GRPO run, ``trl.GRPOTrainer``'s or one of this
library's trainers', and writes ``report.png`` and ``report.md`` into the run folder (several runs: their common parent
folder), or into ``--output``::

    trl-entropy report outputs/aent-toy
    trl-entropy report outputs/grpo-toy outputs/aent-toy --output outputs/compare
    trl-entropy report outputs/demo          # the entropy-collapse demo: one seed's runs overlaid
    python -m trl_entropy.report outputs/aent-toy

The entropy-collapse demo (examples/entropy_collapse_demo.py) writes a ``trainer_state.json`` per run
(``<output_dir>/seed<N>/<run>/phase<1|2>``) with the held-out pass@k as ``eval/pass@k`` at the last step. Its
folder, or one seed's, reads as that seed's phase-1 runs and the start policy; a folder of several seeds is refused
with the seed folders to pass; one run's folder (``seed0/grpo``) reads as its two phases.

The picture has one panel per quantity the log holds:

* the mean token entropy and the mean reward against the optimizer step: the logged values faint, their trailing
  moving average (``--smoothing`` logged values; by default a tenth of the run's points) solid;
* each entropy controller the run logged, on its own panel (:func:`controller_panels`, from the methods' declarations);
* the entropy–reward law ``R = −a·exp(H) + b`` (Cui et al., "The Entropy Mechanism of Reinforcement Learning for
  Reasoning Language Models", arXiv:2505.22617, eq. 6), fitted with :func:`trl_entropy.fit_entropy_law` on the log
  entries holding both an entropy and a reward, drawn over their scatter with ``a``, ``b``, the predicted ceiling
  ``b − a``, R² and the number of points; when the fit is not well posed no curve is drawn and the reason is given;
* ``eval/pass@k`` (:class:`trl_entropy.PassAtKCallback`) against ``k`` and against the step.

A quantity no run logged leaves its panel out, with one line saying so (on the command line and in ``report.md``).
Several runs are overlaid, one colour a run, each named by its folder. Drawing needs matplotlib, the ``plot`` extra
(``pip install -e ".[plot]"``); the command checks for it before it reads anything.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np


if TYPE_CHECKING:  # the law (and the transformers import behind it) loads only once matplotlib is known to be there
    from trl_entropy.evaluation.entropy_law import EntropyLaw


__all__ = [
    "DemoFolderError",
    "LawFit",
    "Report",
    "RunLog",
    "expand_demo_folders",
    "find_trainer_state",
    "fit_law",
    "main",
    "missing_matplotlib",
    "moving_average",
    "read_run",
    "write_report",
    "controller_panels",
    "entropy_targets",
]

PLOT_EXTRA = "plot"
INSTALL_PLOT = f'pip install -e ".[{PLOT_EXTRA}]"'
TRAINER_STATE = "trainer_state.json"
CHECKPOINT = re.compile(r"checkpoint-(\d+)")
PASS_AT_K = re.compile(r"eval/pass@(\d+)")
ENTROPY, REWARD = "entropy", "reward"


def controller_panels() -> tuple:
    """The panels of the values the methods log, one per metric with a title in a method's declaration
    (``trl_entropy.methods.spec.Metric``: ``key``, ``title``, ``ylabel``, ``smooth``), in the registry's order."""
    from trl_entropy.methods import SPECS  # the registry imports TRL's trainers: only once there is a report to draw

    return tuple(metric for spec in SPECS for metric in spec.metrics if metric.title)


def entropy_targets() -> dict[str, str]:
    """The entropy targets the methods log (metric -> label): drawn dashed on the entropy panel."""
    from trl_entropy.methods import SPECS

    return {metric.key: metric.target_label for spec in SPECS for metric in spec.metrics if metric.target_label}


# The keys EntropyLawCallback logs: its last values are quoted next to the report's own fit.
LOGGED_LAW = ("entropy/law_a", "entropy/law_b", "entropy/predicted_ceiling")


def _law_thresholds() -> dict:
    """fit_entropy_law's own thresholds, to say why a fit is not well posed."""
    from trl_entropy.evaluation.entropy_law import fit_entropy_law

    return {
        name: parameter.default
        for name, parameter in inspect.signature(fit_entropy_law).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }


class RunLogError(ValueError):
    """A run folder without a readable log history."""


class DemoFolderError(RunLogError):
    """The entropy-collapse demo's output folder holding several seeds: the message names each seed's folder."""


# ---------------------------------------------------------------------------------------------------------------------
# Reading the logs
# ---------------------------------------------------------------------------------------------------------------------


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
            if _is_number(value) and math.isfinite(value):
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
            if _is_number(entropy) and _is_number(reward) and math.isfinite(entropy) and math.isfinite(reward):
                entropies.append(float(entropy))
                rewards.append(float(reward))
        return np.asarray(entropies, dtype=np.float64), np.asarray(rewards, dtype=np.float64)

    def pass_at_k(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """``{k: (steps, values)}`` of every ``eval/pass@k`` logged."""
        ks = sorted(
            {int(match.group(1)) for entry in self.history for key in entry if (match := PASS_AT_K.fullmatch(key))}
        )
        return {k: self.series(f"eval/pass@{k}") for k in ks if self.has(f"eval/pass@{k}")}


def _is_number(value) -> bool:
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
    written by examples/entropy_collapse_demo.py is its runs (each ``trainer_state.json`` holds the run's log and its
    held-out ``eval/pass@k``):

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


# ---------------------------------------------------------------------------------------------------------------------
# Numbers: smoothing and the law fit
# ---------------------------------------------------------------------------------------------------------------------


def moving_average(values, window: int) -> np.ndarray:
    """Trailing moving average over ``window`` values (the first ones average the values seen so far)."""
    values = np.asarray(values, dtype=np.float64)
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    totals = np.cumsum(np.concatenate([[0.0], values]))
    ends = np.arange(1, values.size + 1)
    starts = np.maximum(0, ends - window)
    return (totals[ends] - totals[starts]) / (ends - starts)


def default_window(num_points: int) -> int:
    """A tenth of the points, at least 1."""
    return max(1, num_points // 10)


@dataclass
class LawFit:
    """The law fitted on one run: ``law`` and its R², or ``None`` and why not."""

    num_pairs: int
    law: EntropyLaw | None = None
    r_squared: float | None = None
    reason: str | None = None


def fit_law(entropies, rewards) -> LawFit:
    """:func:`trl_entropy.fit_entropy_law` on the pairs, with R² (``None`` when the rewards do not vary), or the
    reason it is not well posed."""
    from trl_entropy.evaluation.entropy_law import fit_entropy_law

    entropies, rewards = np.asarray(entropies, dtype=np.float64), np.asarray(rewards, dtype=np.float64)
    law = fit_entropy_law(entropies, rewards)
    if law is None:
        return LawFit(entropies.size, reason=_why_no_fit(entropies))
    residual = rewards - law.predict(entropies)
    total = float(np.sum((rewards - rewards.mean()) ** 2))
    r_squared = 1.0 - float(np.sum(residual**2)) / total if total > 0 else None
    return LawFit(entropies.size, law=law, r_squared=r_squared)


def _why_no_fit(entropies: np.ndarray) -> str:
    thresholds = _law_thresholds()
    min_points = thresholds.get("min_points")
    min_spread = thresholds.get("min_relative_spread")
    if min_points is not None and entropies.size < min_points:
        return f"{entropies.size} (entropy, reward) point{'s' * (entropies.size != 1)}, the fit needs {min_points}"
    x = np.exp(entropies)
    if min_spread is not None and x.size and x.std() < min_spread * x.mean():
        return (
            f"the entropy barely varies (std of exp(H) is {x.std() / x.mean():.2%} of its mean, the fit needs "
            f"{min_spread:.0%})"
        )
    return "fit_entropy_law found the fit not well posed"


# ---------------------------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class Report:
    """What :func:`write_report` drew and wrote: the panels' titles in order, one line per panel left out (and per
    law not fitted) and why, each run's law fit, one line per demo folder read as its runs
    (:func:`expand_demo_folders`), and the two files."""

    runs: list[RunLog]
    panels: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    laws: dict[str, LawFit] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    png: Path | None = None
    markdown: Path | None = None


def missing_matplotlib() -> str | None:
    """``None`` when matplotlib imports; otherwise what to install, naming the ``plot`` extra."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        return (
            f"the report draws with matplotlib, which cannot be imported ({error}). Install the '{PLOT_EXTRA}' extra: "
            f"{INSTALL_PLOT} (in the trl_entropy clone), or: pip install matplotlib"
        )
    return None


def default_output(folders: list[Path]) -> Path:
    """One run: its folder; several: their common parent folder."""
    if len(folders) == 1:
        return folders[0]
    return Path(os.path.commonpath([str(folder.resolve()) for folder in folders]))


def write_report(run_dirs, output_dir=None, smoothing: int | None = None) -> Report:
    """Read the runs' logs (a demo folder: its runs, :func:`expand_demo_folders`), draw ``report.png`` and write
    ``report.md`` into ``output_dir`` (default: :func:`default_output`); returns what was drawn and what was left
    out. RunLogError for a folder without a log history (DemoFolderError for a demo folder of several seeds);
    ImportError without matplotlib."""
    if isinstance(run_dirs, (str, os.PathLike)):
        run_dirs = [run_dirs]
    if not run_dirs:
        raise ValueError("run_dirs must name at least one run folder")
    if smoothing is not None and smoothing < 1:
        raise ValueError(f"smoothing must be at least 1 logged value, got {smoothing}")
    problem = missing_matplotlib()
    if problem:
        raise ImportError(problem)
    run_dirs, notes = expand_demo_folders(run_dirs)
    runs = [read_run(path) for path in run_dirs]
    sources = [run.source.resolve() for run in runs]
    repeated = sorted({str(source) for source in sources if sources.count(source) > 1})
    if repeated:
        raise RunLogError(f"the same log was given more than once: {', '.join(repeated)}; name each run once")
    for run, name in zip(runs, run_names([run.folder for run in runs])):
        run.name = name
    output = Path(output_dir) if output_dir is not None else default_output([run.folder for run in runs])
    output.mkdir(parents=True, exist_ok=True)
    report = Report(runs=runs, notes=notes, png=output / "report.png", markdown=output / "report.md")
    for run in runs:
        if run.has(ENTROPY) or run.has(REWARD):
            report.laws[run.name] = fit_law(*run.pairs())
    _draw(report, smoothing)
    report.markdown.write_text(_markdown(report, smoothing))
    return report


def _colours(count: int) -> list:
    import matplotlib.pyplot as plt

    palette = plt.get_cmap("tab10")
    return [palette(index % 10) for index in range(count)]


def _draw(report: Report, smoothing: int | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs, colours = report.runs, _colours(len(report.runs))
    panels: list[tuple[str, callable]] = []  # (title, draw(axis))
    several = len(runs) > 1

    def none_logged(what: str) -> str:
        return f"no run logged {what}" if several else f"the run did not log {what}"

    for key, label in ((ENTROPY, "mean token entropy (nats)"), (REWARD, "mean reward")):
        if any(run.has(key) for run in runs):
            title = "Entropy" if key == ENTROPY else "Reward"
            panels.append((f"{title} against the step", _curve_drawer(runs, colours, key, label, smoothing)))
        else:
            report.left_out.append(f"{key}: left out, {none_logged(repr(key))}")
    controllers = controller_panels()
    for panel in controllers:
        if any(run.has(panel.key) for run in runs):
            drawer = _curve_drawer(runs, colours, panel.key, panel.ylabel, smoothing, smooth=panel.smooth)
            panels.append((panel.title, drawer))
    if not any(run.has(panel.key) for run in runs for panel in controllers):
        keys = ", ".join(panel.key for panel in controllers)
        report.left_out.append(f"controllers: left out, {none_logged('any of ' + keys)}")
    if any(run.pairs()[0].size for run in runs):
        panels.append(("Entropy–reward law R = −a·exp(H) + b", lambda axis: _draw_law(axis, report, colours)))
    else:
        report.left_out.append(
            f"entropy–reward law: left out, {none_logged(repr(ENTROPY) + ' and ' + repr(REWARD) + ' together')}"
        )
    for run in runs:
        fit = report.laws.get(run.name)
        if fit is not None and fit.law is None and fit.num_pairs:
            report.left_out.append(f"entropy–reward law of {run.name}: no fit drawn, {fit.reason}")
    if any(run.pass_at_k() for run in runs):
        panels.append(("pass@k against k (last evaluation)", lambda axis: _draw_pass_at_k_by_k(axis, runs, colours)))
        panels.append(("pass@k against the step", lambda axis: _draw_pass_at_k_by_step(axis, runs, colours)))
    else:
        report.left_out.append(f"pass@k: left out, {none_logged('eval/pass@k')} (trl_entropy.PassAtKCallback logs it)")
    if several:
        for panel_title, _ in panels:
            if panel_title in {p.title for p in controllers}:
                key = next(p.key for p in controllers if p.title == panel_title)
                missing = [run.name for run in runs if not run.has(key)]
                if missing:
                    report.left_out.append(f"{key}: not logged by {', '.join(missing)}")

    if not panels:  # nothing to draw: say so in a picture too, rather than an empty axis
        panels.append(("Nothing to draw", lambda axis: _draw_nothing(axis, report)))
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    legend_rows = -(-len(runs) // 8) if several else 0
    header = 0.3 + 0.22 * legend_rows  # inches above the panels: the title, then the runs' colours
    height = 3.9 * rows + header
    figure, axes = plt.subplots(rows, columns, figsize=(5.4 * columns, height), squeeze=False)
    for axis, (panel_title, drawer) in zip(axes.flat, panels):
        drawer(axis)
        axis.set_title(panel_title, fontsize=10)
        axis.grid(alpha=0.3)
    for axis in list(axes.flat)[len(panels) :]:
        axis.remove()
    windows = sorted({_window(run, smoothing) for run in runs})
    subtitle = f"faint: logged values; solid: trailing mean over {'/'.join(map(str, windows))} logged value(s)"
    title = subtitle if several else f"{runs[0].name}: {subtitle}"
    figure.suptitle(title, fontsize=10, y=1 - 0.12 / height, va="top")
    if several:
        handles = [plt.Line2D([], [], color=colour, linewidth=2.5) for colour in colours]
        figure.legend(
            handles,
            [run.name for run in runs],
            loc="upper center",
            bbox_to_anchor=(0.5, 1 - 0.3 / height),
            ncol=min(len(runs), 8),
            fontsize=9,
            frameon=False,
        )
    figure.tight_layout(rect=(0, 0, 1, 1 - header / height))
    figure.savefig(report.png, dpi=80)
    report.panels = [axis.get_title() for axis in figure.axes if axis.get_title()]
    plt.close(figure)


def _window(run: RunLog, smoothing: int | None) -> int:
    if smoothing is not None:
        return smoothing
    return default_window(max(run.series(ENTROPY)[1].size, run.series(REWARD)[1].size, 1))


def _curve_drawer(runs, colours, key, ylabel, smoothing, smooth=True):
    from matplotlib.ticker import MaxNLocator

    def draw(axis):
        low, high = math.inf, -math.inf
        for run, colour in zip(runs, colours):
            steps, values = run.series(key)
            if not values.size:
                continue
            low, high = min(low, values.min()), max(high, values.max())
            marker = "." if values.size < 50 else None
            if smooth:
                axis.plot(steps, values, color=colour, alpha=0.25, linewidth=0.8, marker=marker)
                axis.plot(steps, moving_average(values, _window(run, smoothing)), color=colour, linewidth=1.8)
            else:
                axis.plot(steps, values, color=colour, linewidth=1.8, marker=marker)
            if key == ENTROPY:
                for target_key, target_label in entropy_targets().items():
                    target_steps, targets = run.series(target_key)
                    if targets.size:
                        axis.plot(target_steps, targets, color=colour, linestyle="--", linewidth=1.2)
                        axis.annotate(
                            target_label,
                            (target_steps[-1], targets[-1]),
                            textcoords="offset points",
                            xytext=(-4, 4),
                            ha="right",
                            fontsize=8,
                            color=colour,
                        )
        axis.set(xlabel="optimizer step", ylabel=ylabel)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.ticklabel_format(axis="y", useOffset=False)
        if high - low <= 1e-9 * max(abs(high), 1e-12):  # a constant: centre it instead of magnifying rounding noise
            margin = 0.1 * abs(high) if high else 1.0
            axis.set_ylim(high - margin, high + margin)

    return draw


def _format(value) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def _draw_law(axis, report: Report, colours) -> None:
    high, fitted = 0.0, False
    for run, colour in zip(report.runs, colours):
        entropies, rewards = run.pairs()
        if not entropies.size:
            continue
        high = max(high, float(entropies.max()))
        fit = report.laws[run.name]
        if fit.law is None:
            label = f"{run.name}: no fit ({fit.reason})" if len(report.runs) > 1 else f"no fit: {fit.reason}"
            axis.scatter(entropies, rewards, s=14, color=colour, alpha=0.6, label=label)
            continue
        axis.scatter(entropies, rewards, s=14, color=colour, alpha=0.35)
        fitted, law = True, fit.law
        label = (
            f"a = {law.a:.3g}, b = {law.b:.3g}, ceiling b − a = {law.ceiling:.3g}\n"
            f"R² = {_format(fit.r_squared)}, n = {law.num_points}"
        )
        if len(report.runs) > 1:
            label = f"{run.name}: {label}"
        grid = np.linspace(entropies.min(), entropies.max(), 100)
        axis.plot(grid, law.predict(grid), color=colour, linewidth=2, label=label)
        extrapolated = np.linspace(0.0, entropies.min(), 50)  # to the ceiling at H = 0
        axis.plot(extrapolated, law.predict(extrapolated), color=colour, linewidth=1, linestyle=":")
        axis.plot([0.0], [law.ceiling], marker="*", markersize=10, color=colour)
    if fitted:  # down to H = 0, where the dotted extrapolations reach the predicted ceilings (stars)
        axis.set_xlim(left=0.0, right=high * 1.05 if high > 0 else None)
    axis.set(xlabel="mean token entropy H (nats)", ylabel="mean reward R")
    axis.legend(fontsize=7.5, loc="best")


def _draw_pass_at_k_by_k(axis, runs, colours) -> None:
    all_ks = set()
    for run, colour in zip(runs, colours):
        curves = run.pass_at_k()
        if not curves:
            continue
        prefix = f"{run.name}, " if len(runs) > 1 else ""
        ks = sorted(curves)
        all_ks.update(ks)
        last_step = max(curves[k][0][-1] for k in ks)
        first_step = min(curves[k][0][0] for k in ks)
        if first_step != last_step:
            values = [_value_at(curves[k], first_step) for k in ks]
            label = f"{prefix}step {first_step:g} (first evaluation)"
            axis.plot(ks, values, color=colour, linestyle=":", marker="o", markersize=3, alpha=0.6, label=label)
        values = [_value_at(curves[k], last_step) for k in ks]
        label = f"{prefix}step {last_step:g}"
        axis.plot(ks, values, color=colour, marker="o", markersize=4, linewidth=1.8, label=label)
    axis.set_xscale("log", base=2)
    ticks = sorted(all_ks)
    axis.set_xticks(ticks, [str(k) for k in ticks])
    axis.set(xlabel="k (samples per prompt)", ylabel="pass@k")
    axis.legend(fontsize=7.5, loc="best")


def _value_at(curve, step) -> float:
    steps, values = curve
    matches = np.nonzero(steps == step)[0]
    return float(values[matches[-1]]) if matches.size else math.nan


LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def _draw_pass_at_k_by_step(axis, runs, colours) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    all_ks = sorted({k for run in runs for k in run.pass_at_k()})
    if len(runs) > 1 and len(all_ks) > 2:  # several runs: the smallest and the largest k only, or it is a tangle
        all_ks = [all_ks[0], all_ks[-1]]
    for run, colour in zip(runs, colours):
        for k, (steps, values) in run.pass_at_k().items():
            if k not in all_ks:
                continue
            index = all_ks.index(k)
            style = {"linestyle": LINESTYLES[index % len(LINESTYLES)], "marker": MARKERS[index % len(MARKERS)]}
            axis.plot(steps, values, color=colour, markersize=4, linewidth=1.4, **style)
    handles = [
        Line2D([], [], color="0.3", linestyle=LINESTYLES[i % len(LINESTYLES)], marker=MARKERS[i % len(MARKERS)])
        for i in range(len(all_ks))
    ]
    axis.legend(handles, [f"k = {k}" for k in all_ks], fontsize=7.5, loc="best", ncol=2)
    axis.set(xlabel="optimizer step", ylabel="pass@k")
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))


def _draw_nothing(axis, report: Report) -> None:
    axis.axis("off")
    axis.text(0.5, 0.5, "\n".join(report.left_out), ha="center", va="center", fontsize=9, wrap=True)


# ---------------------------------------------------------------------------------------------------------------------
# report.md
# ---------------------------------------------------------------------------------------------------------------------


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _relative(path: Path, start: Path) -> str:
    try:
        return os.path.relpath(path, start)
    except ValueError:  # another drive
        return str(path)


def _markdown(report: Report, smoothing: int | None) -> str:
    output = report.markdown.parent
    lines = ["# Training report", "", f"![report]({report.png.name})", "", "## Runs", ""]
    rows = []
    for run in report.runs:
        steps = [entry["step"] for entry in run.history if _is_number(entry.get("step"))]
        rows.append(
            [
                run.name,
                f"`{_relative(run.source, output)}`",
                str(len(run.history)),
                str(int(max(steps))) if steps else "n/a",
                str(_window(run, smoothing)),
            ]
        )
    lines += _table(["run", "log read", "log entries", "last step", "smoothing window"], rows)

    lines += ["", "## Entropy and reward (logged values)", ""]
    rows = []
    for run in report.runs:
        row = [run.name]
        for key in (ENTROPY, REWARD):
            values = run.series(key)[1]
            row += (
                [_format(values[0]), _format(values[-1]), _format(values.min()), _format(values.max())]
                if values.size
                else ["n/a"] * 4
            )
        rows.append(row)
    lines += _table(
        ["run", "entropy first", "entropy last", "entropy min", "entropy max"]
        + ["reward first", "reward last", "reward min", "reward max"],
        rows,
    )

    lines += ["", "## Entropy–reward law R = −a·exp(H) + b", ""]
    rows = []
    for run in report.runs:
        fit = report.laws.get(run.name)
        logged = [run.series(key) for key in LOGGED_LAW]
        logged_text = (
            f"a = {_format(logged[0][1][-1])}, b = {_format(logged[1][1][-1])} at step {logged[0][0][-1]:g}"
            if logged[0][1].size and logged[1][1].size
            else "none"
        )
        if fit is None or fit.law is None:
            reason = "no entropy and reward logged" if fit is None else fit.reason
            rows.append(
                [
                    run.name,
                    "n/a",
                    "n/a",
                    "n/a",
                    "n/a",
                    str(fit.num_pairs if fit else 0),
                    f"no fit: {reason}",
                    logged_text,
                ]
            )
        else:
            law = fit.law
            rows.append(
                [
                    run.name,
                    _format(law.a),
                    _format(law.b),
                    _format(law.ceiling),
                    _format(fit.r_squared),
                    str(law.num_points),
                    "fitted",
                    logged_text,
                ]
            )
    lines += _table(
        ["run", "a", "b", "ceiling b − a", "R²", "points", "fit", "logged by EntropyLawCallback (last)"], rows
    )

    controller_rows = []
    for panel in controller_panels():
        for run in report.runs:
            values = run.series(panel.key)[1]
            if values.size:
                controller_rows.append(
                    [
                        panel.key,
                        run.name,
                        _format(values[0]),
                        _format(values[-1]),
                        _format(values.min()),
                        _format(values.max()),
                    ]
                )
    if controller_rows:
        lines += ["", "## Controllers (logged values)", ""]
        lines += _table(["metric", "run", "first", "last", "min", "max"], controller_rows)

    pass_rows, all_ks = [], sorted({k for run in report.runs for k in run.pass_at_k()})
    for run in report.runs:
        curves = run.pass_at_k()
        for step in sorted({float(s) for steps, _ in curves.values() for s in steps}):
            pass_rows.append(
                [run.name, f"{step:g}"]
                + [_format(_value_at(curves[k], step)) if k in curves else "n/a" for k in all_ks]
            )
    if pass_rows:
        lines += ["", "## pass@k (held-out)", ""]
        lines += _table(["run", "step"] + [f"pass@{k}" for k in all_ks], pass_rows)

    if report.left_out:
        lines += ["", "## Left out", ""] + [f"* {line}" for line in report.left_out]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trl-entropy report",
        description=(
            "Draw a GRPO run's log (trainer_state.json, or its latest checkpoint's): entropy and reward, each "
            "controller, the entropy–reward law and pass@k. Writes report.png and report.md. Needs the plot extra: "
            + INSTALL_PLOT
        ),
    )
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_DIR",
        help="a run's output_dir (or a checkpoint folder, or a trainer_state.json), or the entropy-collapse demo's "
        "folder or one seed's (its runs); several are overlaid",
    )
    parser.add_argument(
        "--output",
        metavar="DIR",
        help="folder for report.png and report.md (default: the run's folder; several runs: their common parent)",
    )
    parser.add_argument(
        "--smoothing",
        type=int,
        metavar="N",
        help="trailing moving average over N logged values (default: a tenth of the run's points, at least 1)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """``trl-entropy report RUN_DIR ...`` (a leading ``report`` is the subcommand: to read a folder named
    ``report``, write ``./report``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:
        argv = argv[1:]
    parser = build_parser()
    arguments = parser.parse_args(argv)
    if arguments.smoothing is not None and arguments.smoothing < 1:
        parser.error(f"--smoothing must be at least 1 logged value, got {arguments.smoothing}")
    problem = missing_matplotlib()  # before reading anything
    if problem:
        parser.exit(2, f"{parser.prog}: error: {problem}\n")
    try:
        report = write_report(arguments.runs, arguments.output, arguments.smoothing)
    except RunLogError as error:
        parser.error(str(error))
    for line in report.notes:
        print(f"{parser.prog}: read {line}")
    print(f"{parser.prog}: drew {len(report.panels)} panel(s): {'; '.join(report.panels)}")
    for line in report.left_out:
        print(f"{parser.prog}: {line}")
    print(f"{parser.prog}: wrote {report.png} and {report.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
