"""Drawing ``report.png``: one panel per quantity the runs logged, several runs overlaid one colour each."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from .markdown import format_number
from .runlog import ENTROPY, REWARD, controller_panels, entropy_targets, moving_average, smoothing_window, value_at


if TYPE_CHECKING:
    from .result import Report


def _colours(count: int) -> list:
    import matplotlib.pyplot as plt

    palette = plt.get_cmap("tab10")
    return [palette(index % 10) for index in range(count)]


def draw_report(report: Report, smoothing: int | None) -> None:
    """Draw ``report.png``, recording the panels drawn and, for each quantity no run logged, why it is left out."""
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
    windows = sorted({smoothing_window(run, smoothing) for run in runs})
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
    # The layout is final: without this, savefig draws the whole figure once more for the engine tight_layout leaves.
    figure.set_layout_engine(None)
    figure.savefig(report.png, dpi=80)
    report.panels = [axis.get_title() for axis in figure.axes if axis.get_title()]
    plt.close(figure)


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
                axis.plot(steps, moving_average(values, smoothing_window(run, smoothing)), color=colour, linewidth=1.8)
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
            f"R² = {format_number(fit.r_squared)}, n = {law.num_points}"
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
            values = [value_at(curves[k], first_step) for k in ks]
            label = f"{prefix}step {first_step:g} (first evaluation)"
            axis.plot(ks, values, color=colour, linestyle=":", marker="o", markersize=3, alpha=0.6, label=label)
        values = [value_at(curves[k], last_step) for k in ks]
        label = f"{prefix}step {last_step:g}"
        axis.plot(ks, values, color=colour, marker="o", markersize=4, linewidth=1.8, label=label)
    axis.set_xscale("log", base=2)
    ticks = sorted(all_ks)
    axis.set_xticks(ticks, [str(k) for k in ticks])
    axis.set(xlabel="k (samples per prompt)", ylabel="pass@k")
    axis.legend(fontsize=7.5, loc="best")


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
