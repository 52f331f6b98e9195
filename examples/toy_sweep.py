"""Sweep a method's toy values on the entropy-collapse demo's recipe and pick one by a criterion fixed beforehand.

Each grid point is one run of the demo (phase 1 only: 400 steps on the toy addition task, held-out pass@k up to 16),
next to plain GRPO at the same seed. The pick (stated in docs/demo.md before the sweep was run):

    the best held-out pass@16 among the settings whose training reward (mean over the last tenth of the run) is at
    least GRPO's minus 0.1; ties broken by the higher training reward.

    python examples/toy_sweep.py --method NAME --output_dir outputs/sweep_NAME

writes one YAML per grid point, the demo's outputs, and `sweep.md`, the table with the pick marked. `--help` lists the
methods with a sweep: each method declares its own (`sweep=Sweep(...)` in its `SPEC`, trl_entropy/methods/spec.py),
with the reasons for its values. Methods combined (`--method NAME+NAME`) sweep the grids of their methods that have
one, every other method at its examples/configs values.

A config preset (a method with settings of its own, such as a schedule) is swept with the grid given beside it, every
other value of the preset held:

    python examples/toy_sweep.py --config examples/configs/entreg_cosine.yaml \
        --grid '{"entropy_coef": [0.03, 0.1, 0.3]}' --output_dir outputs/sweep_entreg_cosine

The grid is JSON in the form of a method's (`Sweep.grid`): {field: [values]} for every combination, or
[{field: value}, ...] for these points only.
"""

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys

import yaml

from trl_entropy.methods import METHODS
from trl_entropy.methods.spec import Sweep


# Every name --method accepts whose method declares a toy sweep -> that sweep (grid and fixed settings).
SWEEPS = {name: entry.sweep for name, entry in METHODS.items() if entry.sweep is not None}
REWARD_MARGIN = 0.1
EXAMPLES = os.path.dirname(os.path.abspath(__file__))
DEMO = os.path.join(EXAMPLES, "entropy_collapse_demo.py")
SEPARATOR = "+"  # joins the methods of a combination, as --method does
# A config's keys that a sweep's points never carry: the method is the YAML's first line, and the demo's recipe sets
# num_iterations (2) for every run.
NOT_SWEPT = ("method", "num_iterations")
GRID_FORMS = '{"field": [values]} (every combination) or [{"field": value}, ...] (these points)'


def grid_settings(method: str) -> list[dict]:
    """Every point of the method's grid, or of the grids of the methods combined in ``method``."""
    if method in SWEEPS:
        return SWEEPS[method].points()
    points = [{}]
    for part in method.split(SEPARATOR):
        if part in SWEEPS:
            points = [{**point, **settings} for point in points for settings in grid_settings(part)]
    return points


def fixed_settings(method: str) -> dict:
    """What every point of the sweep shares: a swept method's fixed settings, another method's own YAML (combined)."""
    fixed = {}
    for part in method.split(SEPARATOR):
        if part in SWEEPS:
            fixed.update(SWEEPS[part].fixed)
        elif SEPARATOR in method:
            with open(os.path.join(EXAMPLES, "configs", f"{part}.yaml")) as file:
                fixed.update({k: v for k, v in yaml.safe_load(file).items() if k not in NOT_SWEPT})
    return fixed


def sweepable(method: str) -> str:
    """``--method``'s check: a method with a grid, or methods combined of which at least one has a grid."""
    if method in SWEEPS or (SEPARATOR in method and any(part in SWEEPS for part in method.split(SEPARATOR))):
        return method
    raise argparse.ArgumentTypeError(f"no grid for {method!r}: choose among {sorted(SWEEPS)}, alone or combined")


def grid_points(method: str) -> list[tuple[str, dict]]:
    """(run name, config values) for every point of the method's grid."""
    return named_points(method, grid_settings(method))


def named_points(prefix: str, grid: list[dict]) -> list[tuple[str, dict]]:
    """(run name, config values) for each point of ``grid``: the prefix, then each value after its field's label."""
    labels = field_labels(list(dict.fromkeys(key for settings in grid for key in settings)))
    points = []
    for settings in grid:
        name = prefix + "_" + "_".join(f"{labels[key]}{value_label(value)}" for key, value in settings.items())
        points.append((name.replace(".", "p"), settings))
    return points


def field_labels(fields: list[str]) -> dict[str, str]:
    """Each field's shortest ending, in words, that no other field of the grid ends with (``clip_cov_ratio`` ->
    ``ratio``; ``entrocraft_lower_start`` beside ``entrocraft_upper_start`` -> ``lower_start``), or the whole name
    where every ending is another field's."""
    labels = {}
    for key in fields:
        words = key.split("_")
        ends = ("_".join(words[-n:]) for n in range(1, len(words) + 1))
        others = [other for other in fields if other != key]
        labels[key] = next((end for end in ends if not any(o == end or o.endswith("_" + end) for o in others)), key)
    return labels


def value_label(value) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def config_yaml(method: str, settings: dict, fixed: dict | None = None) -> str:
    """The YAML of one grid point: the method, the settings every point shares, then the point's own."""
    values = {**(fixed_settings(method) if fixed is None else fixed), **settings}
    return f"method: {method}\n" + "".join(f"{key}: {value}\n" for key, value in values.items())


def preset_sweep(path: str, grid_json: str) -> tuple[str, Sweep]:
    """``--config`` with ``--grid``: (the preset's method, a sweep of the grid with the preset's other values fixed).
    The grid may only name fields of the method's config, and must have two points or more."""
    with open(path) as file:
        preset = yaml.safe_load(file)
    method = preset.get("method") if isinstance(preset, dict) else None
    if method not in METHODS:
        raise SystemExit(f"--config {path}: no `method:` among {sorted(METHODS)}; a preset names its method")
    try:
        grid = json.loads(grid_json)
    except json.JSONDecodeError as error:
        raise SystemExit(f"--grid is not JSON ({error}): give {GRID_FORMS}") from None
    if not (isinstance(grid, dict) and all(isinstance(v, list) for v in grid.values())) and not (
        isinstance(grid, list) and all(isinstance(point, dict) for point in grid)
    ):
        raise SystemExit(f"--grid: give {GRID_FORMS}")
    sweep = Sweep(grid)
    points = sweep.points()
    if any(set(point) != set(points[0]) for point in points):
        raise SystemExit("--grid: every point of a list grid sets the same fields (the table has a column for each)")
    values = [value for point in points for value in point.values()]
    if not all(isinstance(value, (int, float, str, bool)) for value in values):
        raise SystemExit("--grid: each value is a number, a string or a boolean")
    known = {field.name for field in dataclasses.fields(METHODS[method].config_class)}
    unknown = sorted(set(sweep.fields()) - known)
    if unknown:
        raise SystemExit(f"--grid names {unknown}, no field of {method}'s config: sweep fields of the preset's method")
    if len(points) < 2:
        raise SystemExit("--grid has one point: a sweep compares two settings or more")
    if len({tuple(sorted(point.items())) for point in points}) < len(points):
        raise SystemExit("--grid has a point twice")
    held = {key: value for key, value in preset.items() if key not in (*NOT_SWEPT, *sweep.fields())}
    return method, Sweep(grid, fixed=held)


def pick(summaries: dict, names: list[str], reference: str = "grpo") -> str | None:
    """The criterion above: the best pass@16 among the runs whose final reward is within REWARD_MARGIN of GRPO's."""
    floor = summaries[reference]["final_reward"] - REWARD_MARGIN
    eligible = [name for name in names if summaries[name]["final_reward"] >= floor]
    if not eligible:
        return None
    return max(eligible, key=lambda name: (summaries[name]["pass_at_k"][16], summaries[name]["final_reward"]))


def sweep_table(summaries: dict, points: list[tuple[str, dict]], chosen: str | None) -> str:
    fields = list(points[0][1])
    header = [*fields, "reward last 10%", "pass@1", "pass@16", "H final", "eligible", "pick"]
    floor = summaries["grpo"]["final_reward"] - REWARD_MARGIN
    rows = [["GRPO (reference)", *[""] * (len(fields) - 1), *cells(summaries["grpo"]), "", ""]]
    for name, settings in points:
        summary = summaries[name]
        eligible = "yes" if summary["final_reward"] >= floor else "no"
        rows.append(
            [*(f"{settings[f]:g}" for f in fields), *cells(summary), eligible, "**←**" if name == chosen else ""]
        )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)]) + "\n"


def cells(summary: dict) -> list[str]:
    return [
        f"{summary['final_reward']:.3f}",
        f"{summary['pass_at_k'][1]:.3f}",
        f"{summary['pass_at_k'][16]:.3f}",
        f"{summary['final_entropy']:.3f}",
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    swept = parser.add_mutually_exclusive_group(required=True)
    swept.add_argument("--method", type=sweepable, help=f"one of {sorted(SWEEPS)}, or NAME+NAME")
    swept.add_argument("--config", help="a config preset (YAML with its `method:`) to sweep with --grid")
    parser.add_argument("--grid", help=f"with --config: the JSON grid, {GRID_FORMS}")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max_steps", type=int, default=400)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    if (args.config is None) != (args.grid is None):
        parser.error(
            "--grid goes with --config (a method's own grid is in its declaration), and --config needs --grid"
        )
    if args.config is not None:
        method, sweep = preset_sweep(args.config, args.grid)
        points = named_points(os.path.splitext(os.path.basename(args.config))[0], sweep.points())
        fixed = sweep.fixed
    else:
        method, points, fixed = args.method, grid_points(args.method), None
    configs = os.path.join(args.output_dir, "configs")
    os.makedirs(configs, exist_ok=True)
    for name, settings in points:
        with open(os.path.join(configs, f"{name}.yaml"), "w") as file:
            file.write(config_yaml(method, settings, fixed))
    command = [
        sys.executable,
        DEMO,
        *("--output_dir", args.output_dir, "--configs_dir", configs, "--phase2_steps", "0"),
        *("--seed", str(args.seed), "--max_steps", str(args.max_steps), "--workers", str(args.workers)),
        "--methods",
        "grpo",
        *(name for name, _ in points),
    ]
    subprocess.run(command, check=True)
    with open(os.path.join(args.output_dir, "history.json")) as file:
        summaries = json.load(file)["summaries"]
    for summary in summaries.values():  # JSON keys are strings
        summary["pass_at_k"] = {int(k): v for k, v in summary["pass_at_k"].items()}
    chosen = pick(summaries, [name for name, _ in points])
    table = sweep_table(summaries, points, chosen)
    verdict = f"pick: {chosen} {dict(points)[chosen]}" if chosen else "pick: none (no setting keeps the reward)"
    with open(os.path.join(args.output_dir, "sweep.md"), "w") as file:
        file.write(
            f"`{shlex.join(['python', 'examples/toy_sweep.py', *(argv or sys.argv[1:])])}`\n\n{table}\n{verdict}\n"
        )
    print(table)
    print(verdict)
    return 0


if __name__ == "__main__":
    sys.exit(main())
