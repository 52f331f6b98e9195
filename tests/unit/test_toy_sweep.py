"""The toy-value sweep (examples/toy_sweep.py): its pick, checked against the criterion docs/demo.md states (the best
held-out pass@16 among the settings whose training reward is at least GRPO's minus 0.1; ties: the higher reward), and
its points, read from the methods' declarations (``MethodSpec.sweep``): the runs it made before they moved there, and
every point a config its method accepts."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("toy_sweep", ROOT / "examples" / "toy_sweep.py")
toy_sweep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(toy_sweep)


def summary(reward, pass16):
    return {"final_reward": reward, "pass_at_k": {1: 0.3, 16: pass16}, "final_entropy": 0.4}


@pytest.mark.parametrize(
    ("runs", "expected"),
    [
        ({"a": summary(0.75, 0.6), "b": summary(0.69, 0.9)}, "a"),  # b is 0.11 below GRPO's reward: not eligible
        ({"a": summary(0.70, 0.6), "b": summary(0.71, 0.7)}, "b"),  # 0.70 is exactly the floor: eligible
        ({"a": summary(0.72, 0.7), "b": summary(0.75, 0.7)}, "b"),  # a tie on pass@16: the higher reward
        ({"a": summary(0.5, 0.9), "b": summary(0.6, 0.9)}, None),  # nobody keeps the reward
    ],
)
def test_the_pick_follows_the_stated_criterion(runs, expected):
    summaries = {"grpo": summary(0.8, 0.4), **runs}
    assert toy_sweep.pick(summaries, list(runs)) == expected


def test_every_grid_point_has_its_own_name_and_the_table_marks_the_pick():
    for method in toy_sweep.SWEEPS:
        names = [name for name, _ in toy_sweep.grid_points(method)]
        assert len(set(names)) == len(names) and all("." not in name for name in names)
    points = toy_sweep.grid_points("clip_cov")[:2]
    summaries = {"grpo": summary(0.8, 0.4), points[0][0]: summary(0.75, 0.5), points[1][0]: summary(0.6, 0.9)}
    table = toy_sweep.sweep_table(summaries, points, points[0][0])
    rows = table.splitlines()
    assert rows[3].endswith("| yes | **←** |") and rows[4].endswith("| no |  |")
    assert "| 0.01 | 0.05 | 0.750 |" in rows[3]


def test_a_grid_of_paired_points_runs_those_points_only():
    # A grid given as a list (a band's two ends go in pairs) runs its points, not the product of the fields' values.
    paired = [method for method, sweep in toy_sweep.SWEEPS.items() if isinstance(sweep.grid, list)]
    assert paired
    for method in paired:
        points = toy_sweep.grid_points(method)
        assert [settings for _, settings in points] == toy_sweep.SWEEPS[method].grid
        assert len({name for name, _ in points}) == len(points)


def test_methods_combined_sweep_their_grids_with_the_others_at_their_configs():
    """A combination of a swept method and one without a grid: the swept method's points, each with the other's
    examples/configs values; the YAML of every point names the combination."""
    import yaml

    from trl_entropy.methods import METHODS, combination

    swept = next(iter(toy_sweep.SWEEPS))
    other = next(
        name
        for name in METHODS
        if name not in toy_sweep.SWEEPS
        and (ROOT / "examples" / "configs" / f"{name}.yaml").exists()
        and combines(swept, name)
    )
    method = combination([swept, other]).key
    expected = yaml.safe_load((ROOT / "examples" / "configs" / f"{other}.yaml").read_text())
    assert [settings for _, settings in toy_sweep.grid_points(method)] == toy_sweep.grid_settings(swept)
    fixed = toy_sweep.fixed_settings(method)
    assert {key: fixed[key] for key in expected if key not in ("method", "num_iterations")} == {
        key: value for key, value in expected.items() if key not in ("method", "num_iterations")
    }
    assert toy_sweep.sweepable(method) == method
    with pytest.raises(Exception, match="no grid"):
        toy_sweep.sweepable(other)


def combines(first, second) -> bool:
    from trl_entropy.methods import combination

    try:
        combination([first, second])
    except ValueError:
        return False
    return True


# The runs toy_sweep made before the grids moved from examples/toy_sweep.py into the methods' declarations (issue 43),
# as it made them then: a grid of every combination (Clip-Cov's), one of paired points with settings every point
# shares (ERC's), and the two combined. (run name, config values), in the order they run.
CLIP_COV_BEFORE = [
    ("clip_cov_ratio0p01_lb0p05", {"clip_cov_ratio": 0.01, "clip_cov_lb": 0.05}),
    ("clip_cov_ratio0p01_lb0p2", {"clip_cov_ratio": 0.01, "clip_cov_lb": 0.2}),
    ("clip_cov_ratio0p01_lb1", {"clip_cov_ratio": 0.01, "clip_cov_lb": 1.0}),
    ("clip_cov_ratio0p02_lb0p05", {"clip_cov_ratio": 0.02, "clip_cov_lb": 0.05}),
    ("clip_cov_ratio0p02_lb0p2", {"clip_cov_ratio": 0.02, "clip_cov_lb": 0.2}),
    ("clip_cov_ratio0p02_lb1", {"clip_cov_ratio": 0.02, "clip_cov_lb": 1.0}),
    ("clip_cov_ratio0p05_lb0p05", {"clip_cov_ratio": 0.05, "clip_cov_lb": 0.05}),
    ("clip_cov_ratio0p05_lb0p2", {"clip_cov_ratio": 0.05, "clip_cov_lb": 0.2}),
    ("clip_cov_ratio0p05_lb1", {"clip_cov_ratio": 0.05, "clip_cov_lb": 1.0}),
    ("clip_cov_ratio0p1_lb0p05", {"clip_cov_ratio": 0.1, "clip_cov_lb": 0.05}),
    ("clip_cov_ratio0p1_lb0p2", {"clip_cov_ratio": 0.1, "clip_cov_lb": 0.2}),
    ("clip_cov_ratio0p1_lb1", {"clip_cov_ratio": 0.1, "clip_cov_lb": 1.0}),
    ("clip_cov_ratio0p2_lb0p05", {"clip_cov_ratio": 0.2, "clip_cov_lb": 0.05}),
    ("clip_cov_ratio0p2_lb0p2", {"clip_cov_ratio": 0.2, "clip_cov_lb": 0.2}),
    ("clip_cov_ratio0p2_lb1", {"clip_cov_ratio": 0.2, "clip_cov_lb": 1.0}),
    ("clip_cov_ratio0p5_lb0p05", {"clip_cov_ratio": 0.5, "clip_cov_lb": 0.05}),
    ("clip_cov_ratio0p5_lb0p2", {"clip_cov_ratio": 0.5, "clip_cov_lb": 0.2}),
    ("clip_cov_ratio0p5_lb1", {"clip_cov_ratio": 0.5, "clip_cov_lb": 1.0}),
]
ERC_BEFORE = [
    ("erc_low0p98_high1p02", {"erc_low": 0.98, "erc_high": 1.02}),
    ("erc_low0p95_high1p05", {"erc_low": 0.95, "erc_high": 1.05}),
    ("erc_low0p9_high1p1", {"erc_low": 0.9, "erc_high": 1.1}),
    ("erc_low0p8_high1p2", {"erc_low": 0.8, "erc_high": 1.2}),
]
ERC_FIXED_BEFORE = {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28}


def test_the_sweeps_run_what_they_ran_before_they_moved_into_the_declarations():
    assert toy_sweep.grid_points("clip_cov") == CLIP_COV_BEFORE
    assert toy_sweep.fixed_settings("clip_cov") == {}
    assert toy_sweep.config_yaml("clip_cov", CLIP_COV_BEFORE[0][1]) == (
        "method: clip_cov\nclip_cov_ratio: 0.01\nclip_cov_lb: 0.05\n"
    )
    assert toy_sweep.grid_points("erc") == ERC_BEFORE
    assert toy_sweep.fixed_settings("erc") == ERC_FIXED_BEFORE
    assert toy_sweep.config_yaml("erc", ERC_BEFORE[0][1]) == (
        "method: erc\nloss_type: dapo\nepsilon: 0.2\nepsilon_high: 0.28\nerc_low: 0.98\nerc_high: 1.02\n"
    )
    # Combined: every Clip-Cov point with every ERC point, Clip-Cov's varying slowest; ERC's fixed settings first.
    combined = toy_sweep.grid_points("clip_cov+erc")
    assert [settings for _, settings in combined] == [
        {**clip_cov, **erc} for _, clip_cov in CLIP_COV_BEFORE for _, erc in ERC_BEFORE
    ]
    assert combined[0][0] == "clip_cov+erc_ratio0p01_lb0p05_low0p98_high1p02"
    assert combined[-1][0] == "clip_cov+erc_ratio0p5_lb1_low0p8_high1p2"
    assert toy_sweep.config_yaml("clip_cov+erc", combined[0][1]) == (
        "method: clip_cov+erc\nloss_type: dapo\nepsilon: 0.2\nepsilon_high: 0.28\n"
        "clip_cov_ratio: 0.01\nclip_cov_lb: 0.05\nerc_low: 0.98\nerc_high: 1.02\n"
    )


def swept_entries():
    from trl_entropy.methods import METHODS

    return {name: entry for name, entry in METHODS.items() if entry.sweep is not None}


def test_the_script_sweeps_every_method_that_declares_a_sweep():
    swept = swept_entries()
    assert swept and toy_sweep.SWEEPS == {name: entry.sweep for name, entry in swept.items()}
    for name, entry in swept.items():
        assert [settings for _, settings in toy_sweep.grid_points(name)] == entry.sweep.points()
        assert toy_sweep.fixed_settings(name) == entry.sweep.fixed
        assert toy_sweep.sweepable(name) == name


@pytest.mark.parametrize("name", sorted(swept_entries()))
def test_every_point_of_a_sweep_is_a_config_of_its_method(name):
    """A sweep names only fields of its method's config, has two points or more, each once, and its method's config
    accepts every point with the settings the sweep fixes (at the demo's num_iterations, 2)."""
    from _support.grpo import toy_config

    entry = swept_entries()[name]
    fields = {field.name for field in dataclasses.fields(entry.config_class)}
    assert set(entry.sweep.fields()) <= fields, f"{name}'s sweep names no field of {entry.config_class.__name__}"
    points = entry.sweep.points()
    assert len(points) >= 2 and all(point for point in points)
    assert len({tuple(sorted(point.items())) for point in points}) == len(points), f"{name}: a point twice"
    for point in points:
        assert not set(point) & set(entry.sweep.fixed), f"{name}: a field both swept and fixed"
        toy_config(entry.config_class, **{**entry.defaults, "num_iterations": 2, **entry.sweep.fixed, **point})


def test_a_preset_sweeps_its_grid_with_its_other_values_held(tmp_path):
    """``--config PRESET --grid JSON``: the grid's points named after the preset, each YAML the preset's method and its
    other values, the point's own value replacing the preset's; a list grid runs its points only."""
    import yaml

    preset = tmp_path / "entreg_cosine.yaml"
    preset.write_text("method: entreg\nentropy_coef: 0.03\nentropy_coef_schedule: cosine\nentropy_coef_final: 0.0\n")
    method, sweep = toy_sweep.preset_sweep(str(preset), '{"entropy_coef": [0.03, 0.1]}')
    assert method == "entreg"
    assert sweep.fixed == {"entropy_coef_schedule": "cosine", "entropy_coef_final": 0.0}
    points = toy_sweep.named_points("entreg_cosine", sweep.points())
    assert points == [
        ("entreg_cosine_coef0p03", {"entropy_coef": 0.03}),
        ("entreg_cosine_coef0p1", {"entropy_coef": 0.1}),
    ]
    text = toy_sweep.config_yaml(method, points[1][1], sweep.fixed)
    assert yaml.safe_load(text) == {
        "method": "entreg",
        "entropy_coef_schedule": "cosine",
        "entropy_coef_final": 0.0,
        "entropy_coef": 0.1,
    }
    pairs = '[{"entropy_coef": 0.1, "entropy_coef_final": 0.01}, {"entropy_coef": 0.3, "entropy_coef_final": 0.0}]'
    _, paired = toy_sweep.preset_sweep(str(preset), pairs)
    assert paired.points() == [
        {"entropy_coef": 0.1, "entropy_coef_final": 0.01},
        {"entropy_coef": 0.3, "entropy_coef_final": 0.0},
    ]
    assert paired.fixed == {"entropy_coef_schedule": "cosine"}


@pytest.mark.parametrize(
    ("preset", "grid", "message"),
    [
        ("method: entreg\n", '{"entropy_cof": [0.1, 0.3]}', r"\['entropy_cof'\], no field of entreg's config"),
        ("method: entreg\n", '{"entropy_coef": [0.1]}', "one point"),
        ("method: entreg\n", "{entropy_coef: [0.1, 0.3]}", "--grid is not JSON"),
        ("method: entreg\n", '{"entropy_coef": 0.1}', r'--grid: give \{"field": \[values\]\}'),
        ("method: entreg\n", '[{"entropy_coef": 0.1}, {"entropy_coef_final": 0.0}]', "every point of a list grid"),
        ("method: entreg\n", '{"entropy_coef": [0.1, 0.1]}', "a point twice"),
        ("method: entreg\n", '{"entropy_coef": [[0.1], [0.3]]}', "a number, a string or a boolean"),
        ("entropy_coef: 0.1\n", '{"entropy_coef": [0.1, 0.3]}', "no `method:`"),
        ("method: nosuch\n", '{"entropy_coef": [0.1, 0.3]}', "no `method:`"),
    ],
)
def test_a_preset_sweep_refuses_a_grid_it_cannot_run(tmp_path, preset, grid, message):
    path = tmp_path / "preset.yaml"
    path.write_text(preset)
    with pytest.raises(SystemExit, match=message):
        toy_sweep.preset_sweep(str(path), grid)


@pytest.mark.parametrize(
    "arguments", [["--method", next(iter(toy_sweep.SWEEPS)), "--grid", "{}"], ["--config", "x.yaml"]]
)
def test_grid_and_config_go_together(arguments, capsys):
    with pytest.raises(SystemExit):
        toy_sweep.main([*arguments, "--output_dir", "unused"])
    assert "--grid goes with --config" in capsys.readouterr().err


def documented_preset_sweeps() -> list[tuple[str, str]]:
    """The (preset, grid) of every preset sweep docs/demo.md shows the command of."""
    import re
    import shlex

    text = (ROOT / "docs" / "demo.md").read_text()
    sweeps = []
    for command in re.findall(r"`(python examples/toy_sweep\.py --config [^`]+)`", text):
        arguments = shlex.split(command)
        sweeps.append((arguments[arguments.index("--config") + 1], arguments[arguments.index("--grid") + 1]))
    return sweeps


def test_docs_show_the_preset_sweeps_of_the_schedules():
    presets = {Path(preset).name for preset, _ in documented_preset_sweeps()}
    assert presets >= {"entreg_cosine.yaml", "aent_band_schedule.yaml", "siren_cosine.yaml"}


@pytest.mark.parametrize(("preset", "grid"), documented_preset_sweeps())
def test_every_point_of_a_documented_preset_sweep_is_a_config_of_its_method(preset, grid):
    """Each point of a preset sweep docs/demo.md shows builds its method's config with the preset's other values (at
    the demo's num_iterations, 2)."""
    from _support.grpo import toy_config

    from trl_entropy.methods import METHODS

    method, sweep = toy_sweep.preset_sweep(str(ROOT / preset), grid)
    entry = METHODS[method]
    for point in sweep.points():
        toy_config(
            entry.config_class, **{**entry.defaults, "num_iterations": 2, "max_steps": 400, **sweep.fixed, **point}
        )


def test_run_names_tell_the_fields_apart_and_carry_strings():
    """A field is labelled by its shortest ending that no other field of the grid ends with; string values (a
    schedule's shape) go into the name as they are."""
    labels = toy_sweep.field_labels(
        ["entrocraft_lower_start", "entrocraft_lower_end", "entrocraft_upper_start", "entrocraft_upper_end"]
    )
    assert labels == {
        "entrocraft_lower_start": "lower_start",
        "entrocraft_lower_end": "lower_end",
        "entrocraft_upper_start": "upper_start",
        "entrocraft_upper_end": "upper_end",
    }
    assert toy_sweep.field_labels(["clip_cov_ratio", "clip_cov_lb"]) == {
        "clip_cov_ratio": "ratio",
        "clip_cov_lb": "lb",
    }
    assert toy_sweep.field_labels(["coef", "entropy_coef"]) == {"coef": "coef", "entropy_coef": "entropy_coef"}
    grid = [{"entropy_coef_schedule": shape, "entropy_coef": 0.1} for shape in ("linear", "cosine")]
    assert [name for name, _ in toy_sweep.named_points("entreg", grid)] == [
        "entreg_schedulelinear_coef0p1",
        "entreg_schedulecosine_coef0p1",
    ]
