"""The demo's figure, ``entropy_collapse.png``: entropy and reward curves of both phases, pass@k against k, task-B
success before and after phase 2, and held-out pass@1 along training when it was evaluated there."""

from trl_entropy.report.runlog import moving_average

from .summary import curves, mean


def _label_line_ends(axis, ends: list[tuple[float, str, object]], gap: float = 0.045) -> None:
    """Write each run's name just right of its curve's last point, nudged apart (``gap`` in axes fractions) so the
    names never overlap. Call after the axis limits and scale are final."""
    to_fraction = axis.transData + axis.transAxes.inverted()
    x_end = axis.get_xlim()[1]
    placed = sorted((to_fraction.transform((x_end, value))[1], name, colour) for value, name, colour in ends)
    positions = [fraction for fraction, _, _ in placed]
    for index in range(1, len(positions)):
        positions[index] = max(positions[index], positions[index - 1] + gap)
    shift = max(0.0, positions[-1] - placed[-1][0]) / 2 if positions else 0.0  # spread both ways, not only upwards
    for (_, name, colour), position in zip(placed, positions):
        axis.annotate(
            name,
            xy=(1.0, position - shift),
            xycoords="axes fraction",
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8.5,
            color=colour,
            annotation_clip=False,
        )


def run_styles(names: list[str]) -> dict[str, dict]:
    """GRPO thick black, EntReg dashed grey, every method its own colour."""
    import matplotlib.pyplot as plt

    palette, styles, index = plt.get_cmap("tab10"), {}, 0
    for name in names:
        if name == "grpo":
            styles[name] = {"color": "black", "linewidth": 2.6, "zorder": 5}
        elif name == "entreg":
            styles[name] = {"color": "0.5", "linewidth": 2.0, "linestyle": "--", "zorder": 4}
        else:
            styles[name] = {"color": palette(index % 10), "linewidth": 1.7}
            index += 1
    return styles


def mean_curve(histories: list[list[dict]], metric: str, window: int) -> tuple[list[int], list[float]]:
    """The seeds' mean of a metric's moving average (over ``window`` optimizer steps)."""
    smoothed = []
    for history in histories:
        steps, values = curves(history)[metric]
        points = max(1, round(window * len(values) / max(len(history), 1)))  # rewards come every other step
        smoothed.append(moving_average(values, points))
    length = min(len(values) for values in smoothed)
    return steps[:length], [mean([values[i] for values in smoothed]) for i in range(length)]


def _entropy_ticks(axis) -> None:
    low, high = axis.get_ylim()
    candidates = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 4.0)
    ticks = [tick for tick in candidates if low <= tick <= high]
    axis.set_yticks(ticks, [f"{tick:g}" for tick in ticks])
    axis.set_yticks([], minor=True)


def plot(
    phase1: dict[str, list[list[dict]]],
    phase2: dict[str, list[list[dict]]],
    summaries: dict[str, dict],
    initial_pass_at_k: dict[int, float],
    path: str,
    window: int,
    title: str,
    labels: dict[str, str],
    along: dict[str, dict] | None = None,
) -> list[str]:
    """Top row, phase 1 on task A: entropy (log scale), training reward, held-out pass@k against k, and with
    ``along`` (:func:`trl_entropy.demo.summary.along_training`) held-out pass@1 against the step with its 95 %
    interval. Bottom row, phase 2 (plain GRPO on task B from each phase-1 policy): entropy, training reward, and
    held-out task-B pass@1 before and after. Curves are moving averages over ``window`` optimizer steps (means over
    seeds). ``labels`` name the panels' tasks and held-out set (:meth:`trl_entropy.demo.models.DemoModel.labels`).
    Returns the panels' titles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(phase1)
    styles = run_styles(names)
    rows, columns = (2 if phase2 else 1), (4 if along else 3)
    figure, axes = plt.subplots(rows, columns, figsize=(6.3 * columns, 5.4 * rows), squeeze=False)
    panels = [(0, phase1, labels["phase1"])]
    if phase2:
        panels.append((1, phase2, labels["phase2"]))
    for row, histories, label in panels:
        entropy_axis, reward_axis = axes[row][0], axes[row][1]
        ends = {0: [], 1: []}
        for name in names:
            for column, metric in enumerate(("entropy", "reward")):
                steps, values = mean_curve(histories[name], metric, window)
                axes[row][column].plot(steps, values, label=name, **styles[name])
                if values:
                    ends[column].append((values[-1], name, styles[name]["color"]))
        entropy_axis.set(title=f"Mean token entropy, {label}", xlabel="optimizer step", ylabel="entropy (nats)")
        entropy_axis.set_yscale("log")  # a collapse is a fall by a factor; an exploding run does not squash the rest
        _entropy_ticks(entropy_axis)
        reward_axis.set(title=f"Training reward, {label}", xlabel="optimizer step", ylabel="mean reward (success)")
        for column, axis in enumerate((entropy_axis, reward_axis)):
            axis.grid(alpha=0.3)
            axis.set_xlim(0, max(len(history) for runs in histories.values() for history in runs))
            _label_line_ends(axis, ends[column])

    ks = sorted(initial_pass_at_k)
    pass_axis = axes[0][2]
    pass_axis.plot(ks, [initial_pass_at_k[k] for k in ks], color="black", linestyle=":", marker="o", label="start")
    for name in names:
        pass_at_k = summaries[name]["pass_at_k"]
        pass_axis.plot(ks, [pass_at_k[k] for k in ks], marker="o", markersize=3.5, label=name, **styles[name])
    pass_axis.set_xscale("log", base=2)
    pass_axis.set_xticks(ks, [str(k) for k in ks])
    pass_axis.set(
        title=f"Held-out pass@k, {labels['task']}, after phase 1",
        xlabel="k (samples per problem)",
        ylabel=f"pass@k ({labels['held_out']})",
    )
    pass_axis.grid(alpha=0.3)
    pass_axis.legend(fontsize=8, loc="upper left")  # the curves rise from the lower left

    if along:
        along_axis = axes[0][3]
        for name, points in along.items():
            steps = sorted(points)
            intervals = [points[step][1] for step in steps]
            along_axis.plot(steps, [i.mean for i in intervals], marker="o", markersize=3.5, label=name, **styles[name])
            low, high = [i.low for i in intervals], [i.high for i in intervals]
            along_axis.fill_between(steps, low, high, color=styles[name]["color"], alpha=0.12, linewidth=0)
        along_axis.set(
            title=f"Held-out pass@1, {labels['task']}, along training (95 % interval)",
            xlabel="optimizer step",
            ylabel=f"pass@1 ({labels['held_out']})",
        )
        along_axis.grid(alpha=0.3)
        along_axis.legend(fontsize=8)

    if phase2:
        gain_axis = axes[1][2]
        for position, name in enumerate(names):
            summary, colour = summaries[name], styles[name]["color"]
            gain_axis.annotate(
                "",
                xy=(position, summary["b_end"]),
                xytext=(position, summary["b_start"]),
                arrowprops={"arrowstyle": "->", "color": colour, "linewidth": 2},
            )
            gain_axis.plot([position], [summary["b_start"]], marker="o", color=colour, markerfacecolor="white")
            gain_axis.plot([position], [summary["b_end"]], marker="o", color=colour)
            if len(summary["b_ends"]) > 1:  # each seed's end point, to show the spread
                seeds = summary["b_ends"]
                gain_axis.scatter([position + 0.15] * len(seeds), seeds, s=12, color=colour, alpha=0.6)
        gain_axis.set_xticks(range(len(names)), names, rotation=30)
        gain_axis.set(
            title="Held-out pass@1, task B: before (o) and after (●) phase 2",
            ylabel=f"pass@1 ({labels['held_out']})",
        )
        gain_axis.grid(alpha=0.3, axis="y")
    if title:
        figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    figure.subplots_adjust(wspace=0.28, hspace=0.32)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    titles = [axis.get_title() for axis in figure.axes]
    plt.close(figure)
    return titles
