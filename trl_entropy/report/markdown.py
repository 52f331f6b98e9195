"""``report.md``: the numbers behind the picture, one table per quantity."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .runlog import ENTROPY, LOGGED_LAW, REWARD, controller_panels, is_number, smoothing_window, value_at


if TYPE_CHECKING:
    from .result import Report


def format_number(value) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _relative(path: Path, start: Path) -> str:
    try:
        return os.path.relpath(path, start)
    except ValueError:  # another drive
        return str(path)


def report_markdown(report: Report, smoothing: int | None) -> str:
    output = report.markdown.parent
    lines = ["# Training report", "", f"![report]({report.png.name})", "", "## Runs", ""]
    rows = []
    for run in report.runs:
        steps = [entry["step"] for entry in run.history if is_number(entry.get("step"))]
        rows.append(
            [
                run.name,
                f"`{_relative(run.source, output)}`",
                str(len(run.history)),
                str(int(max(steps))) if steps else "n/a",
                str(smoothing_window(run, smoothing)),
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
                [
                    format_number(values[0]),
                    format_number(values[-1]),
                    format_number(values.min()),
                    format_number(values.max()),
                ]
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
            f"a = {format_number(logged[0][1][-1])}, b = {format_number(logged[1][1][-1])} "
            f"at step {logged[0][0][-1]:g}"
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
                    format_number(law.a),
                    format_number(law.b),
                    format_number(law.ceiling),
                    format_number(fit.r_squared),
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
                        format_number(values[0]),
                        format_number(values[-1]),
                        format_number(values.min()),
                        format_number(values.max()),
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
                + [format_number(value_at(curves[k], step)) if k in curves else "n/a" for k in all_ks]
            )
    if pass_rows:
        lines += ["", "## pass@k (held-out)", ""]
        lines += _table(["run", "step"] + [f"pass@{k}" for k in all_ks], pass_rows)

    if report.left_out:
        lines += ["", "## Left out", ""] + [f"* {line}" for line in report.left_out]
    return "\n".join(lines) + "\n"
