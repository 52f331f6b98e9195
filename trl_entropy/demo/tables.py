"""The demo's tables: every number (text and Markdown) and the means with their intervals (Markdown)."""

import math

from .summary import BASELINE


def _cell(key: str, fmt: str):
    """A column's cell: ``summary[key]`` formatted, "–" where there is no value (a law that was never well posed)."""

    def cell(summary: dict) -> str:
        value = summary[key]
        return "–" if isinstance(value, float) and math.isnan(value) else fmt.format(value)

    return cell


def phase1_columns(num_samples: int) -> list[tuple[str, object]]:
    """The phase-1 table: (title, cell) per column."""
    return [
        ("H step 1", _cell("initial_entropy", "{:.3f}")),
        ("H min", _cell("min_entropy", "{:.3f}")),
        ("H final", _cell("final_entropy", "{:.3f}")),
        ("reward first 10%", _cell("initial_reward", "{:.3f}")),
        ("reward last 10%", _cell("final_reward", "{:.3f}")),
        ("held-out success (pass@1)", _cell("held_out_success", "{:.3f}")),
        (f"pass@{num_samples}", lambda summary: f"{summary['pass_at_k'][num_samples]:.3f}"),
        ("law a", _cell("law_a", "{:.3f}")),
        ("law b", _cell("law_b", "{:.3f}")),
        ("ceiling b−a", _cell("law_ceiling", "{:.3f}")),
        ("wall s", _cell("wall_time_s", "{:.0f}")),
    ]


def phase2_columns(num_seeds: int) -> list[tuple[str, object]]:
    """The phase-2 table: (title, cell) per column; with several seeds, each seed's gain too."""
    columns = [
        ("B reward first 10%", _cell("b_initial_reward", "{:.3f}")),
        ("B reward last 10%", _cell("b_final_reward", "{:.3f}")),
        ("phase-2 gain", _cell("phase2_gain", "{:+.3f}")),
        ("B held-out pass@1 before", _cell("b_start", "{:.3f}")),
        ("after", _cell("b_end", "{:.3f}")),
        ("A held-out pass@1 after", _cell("a_after_phase2", "{:.3f}")),
        ("wall s", _cell("phase2_wall_time_s", "{:.0f}")),
    ]
    if num_seeds > 1:
        columns.append(("gain per seed", lambda summary: " / ".join(f"{g:+.3f}" for g in summary["phase2_gains"])))
    return columns


def _interval_text(interval, signed: bool) -> str:
    if interval is None:
        return "–"
    sign = "+" if signed else ""
    text = f"{interval.mean:{sign}.3f}"
    if math.isnan(interval.low):
        return text
    return text + f" [{interval.low:{sign}.3f}, {interval.high:{sign}.3f}]"


def format_interval_table(
    intervals: dict[str, dict], columns: list[tuple[str, str]], num_seeds: int, suffix: str = ""
) -> str:
    """A Markdown table: per quantity, the mean [95 % interval] and the difference to GRPO [95 % interval]."""
    headers = ["run" + suffix]
    for title, _ in columns:
        headers += [title, f"Δ {title} vs {BASELINE}"]
    rows = []
    for name, measures in intervals.items():
        row = [name + suffix]
        for _, key in columns:
            interval, difference = measures[key]
            row += [_interval_text(interval, signed=False), _interval_text(difference, signed=True)]
        rows.append(row)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _table(summaries: dict[str, dict], columns: list[tuple[str, object]], suffix: str) -> list[list[str]]:
    """Header and rows; a run is named with ``suffix`` appended (phase 2 of run "grpo" is "grpo→B")."""
    headers = ["run" + suffix] + [title for title, _ in columns]
    return [headers] + [
        [name + suffix] + [cell(summary) for _, cell in columns] for name, summary in summaries.items()
    ]


def format_table(summaries: dict[str, dict], columns: list[tuple[str, object]], suffix: str = "") -> str:
    """The summaries as an aligned text table."""
    headers, *rows = _table(summaries, columns, suffix)
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    lines = [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in [headers, *rows]
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def format_markdown_table(summaries: dict[str, dict], columns: list[tuple[str, object]], suffix: str = "") -> str:
    """The summaries as a Markdown table."""
    headers, *rows = _table(summaries, columns, suffix)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


# The intervals: (title, measure) per quantity, each shown as its mean [95 % interval] and its difference to GRPO.
def phase1_interval_columns(num_samples: int) -> list[tuple[str, str]]:
    return [
        ("H final", "final_entropy"),
        ("reward last 10%", "final_reward"),
        ("pass@1", "pass@1"),
        (f"pass@{num_samples}", f"pass@{num_samples}"),
    ]


def format_along_training_table(along: dict[str, dict], num_samples: int) -> str:
    """A Markdown table of :func:`trl_entropy.demo.summary.along_training`: a row per run, a column per evaluated
    step, each cell pass@1 and pass@``num_samples`` as mean [95 % interval]."""
    ks = sorted({1, num_samples})
    steps = sorted({step for points in along.values() for step in points})
    headers = ["run"] + [f"step {step}" for step in steps]
    rows = [
        [name]
        + [
            " / ".join(_interval_text(points[step][k], signed=False) for k in ks) if step in points else "–"
            for step in steps
        ]
        for name, points in along.items()
    ]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] + ["---:"] * len(steps)) + "|"]
    note = "Each cell: " + " / ".join(f"pass@{k}" for k in ks) + "."
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + f"\n\n{note}"


PHASE2_INTERVAL_COLUMNS = [
    ("phase-2 gain", "phase2_gain"),
    ("B pass@1 after", "b_end"),
    ("A pass@1 after", "a_after_phase2"),
]
