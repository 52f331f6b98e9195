"""``trl-entropy report RUN_DIR [RUN_DIR ...]`` and ``python -m trl_entropy.report``: the command line of
:func:`trl_entropy.report.write_report` (docs/report.md)."""

import argparse

from . import INSTALL_PLOT, RunLogError, missing_matplotlib, write_report


def build_parser(prog: str = "trl-entropy report") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
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


def main(argv: list[str] | None = None, prog: str = "trl-entropy report") -> int:
    """``trl-entropy report RUN_DIR ...``: draw the runs' logs; a bad command line or folder exits with status 2."""
    parser = build_parser(prog)
    arguments = parser.parse_args(argv)  # None: the process's own arguments
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
