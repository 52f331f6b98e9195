"""Pictures of your own run: ``trl-entropy report RUN_DIR [RUN_DIR ...]``.

Reads the log history (``log_history`` of ``trainer_state.json``) of any GRPO run, ``trl.GRPOTrainer``'s or one of this
library's trainers', and writes ``report.png`` and ``report.md`` into the run folder (several runs: their common parent
folder), or into ``--output``::

    trl-entropy report outputs/grpo-toy
    trl-entropy report outputs/grpo-toy outputs/entreg-toy --output outputs/compare
    trl-entropy report outputs/demo          # the entropy-collapse demo: one seed's runs overlaid
    python -m trl_entropy.report outputs/grpo-toy

The parts: reading the logs (:mod:`.runlog`), drawing (:mod:`.drawing`), the tables of ``report.md``
(:mod:`.markdown`); the law's fit is :func:`trl_entropy.evaluation.entropy_law_fit`, the command line
:mod:`trl_entropy.report.command`.

The entropy-collapse demo (``trl-entropy demo``) writes a ``trainer_state.json`` per run
(``<output_dir>/seed<N>/<run>/phase<1|2>``) with the held-out pass@k as ``eval/pass@k`` at the last step. Its
folder, or one seed's, reads as that seed's phase-1 runs and the start policy; a folder of several seeds is refused
with the seed folders to pass; one run's folder (``seed0/grpo``) reads as its two phases.

The picture has one panel per quantity the log holds:

* the mean token entropy and the mean reward against the optimizer step: the logged values faint, their trailing
  moving average (``--smoothing`` logged values; by default a tenth of the run's points) solid;
* each entropy controller the run logged, on its own panel (:func:`controller_panels`, from the methods' declarations);
* the entropy–reward law ``R = −a·exp(H) + b`` (Cui et al., "The Entropy Mechanism of Reinforcement Learning for
  Reasoning Language Models", arXiv:2505.22617, eq. 6), fitted with :func:`trl_entropy.evaluation.entropy_law_fit`
  on the log entries holding both an entropy and a reward, drawn over their scatter with ``a``, ``b``, the predicted
  ceiling ``b − a``, R² and the number of points; when the fit is not well posed no curve is drawn and the reason is
  given;
* ``eval/pass@k`` (:class:`trl_entropy.PassAtKCallback`) against ``k`` and against the step.

A quantity no run logged leaves its panel out, with one line saying so (on the command line and in ``report.md``).
Several runs are overlaid, one colour a run, each named by its folder. Drawing needs matplotlib, the ``plot`` extra
(``pip install -e ".[plot]"``); the command checks for it before it reads anything.
"""

from __future__ import annotations

import os
from pathlib import Path

from .drawing import draw_report
from .markdown import report_markdown
from .result import Report
from .runlog import (
    ENTROPY,
    REWARD,
    DemoFolderError,
    RunLog,
    RunLogError,
    controller_panels,
    entropy_targets,
    expand_demo_folders,
    find_trainer_state,
    moving_average,
    read_run,
    run_names,
)


__all__ = [
    "DemoFolderError",
    "Report",
    "RunLog",
    "RunLogError",
    "controller_panels",
    "default_output",
    "entropy_targets",
    "expand_demo_folders",
    "find_trainer_state",
    "missing_matplotlib",
    "moving_average",
    "read_run",
    "write_report",
]

PLOT_EXTRA = "plot"
INSTALL_PLOT = f'pip install -e ".[{PLOT_EXTRA}]"'


def missing_matplotlib(drawer: str = "the report draws") -> str | None:
    """``None`` when matplotlib imports; otherwise what to install, naming the ``plot`` extra (``drawer``: who needs
    it, as the message's subject)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        return (
            f"{drawer} with matplotlib, which cannot be imported ({error}). Install the '{PLOT_EXTRA}' extra: "
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
    from trl_entropy.evaluation.entropy_law import entropy_law_fit

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
            report.laws[run.name] = entropy_law_fit(*run.pairs())
    draw_report(report, smoothing)
    report.markdown.write_text(report_markdown(report, smoothing))
    return report
