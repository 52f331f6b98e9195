"""The toy-value sweep's pick (examples/toy_sweep.py), checked against the criterion docs/demo.md states: the best
held-out pass@16 among the settings whose training reward is at least GRPO's minus 0.1 (ties: the higher reward)."""

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
    for method in toy_sweep.GRIDS:
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
    paired = [method for method, grid in toy_sweep.GRIDS.items() if isinstance(grid, list)]
    assert paired
    for method in paired:
        points = toy_sweep.grid_points(method)
        assert [settings for _, settings in points] == toy_sweep.GRIDS[method]
        assert len({name for name, _ in points}) == len(points)


def test_methods_combined_sweep_their_grids_with_the_others_at_their_configs():
    """A combination of a swept method and one without a grid: the swept method's points, each with the other's
    examples/configs values; the YAML of every point names the combination."""
    import yaml

    from trl_entropy.methods import METHODS, combination

    swept = next(iter(toy_sweep.GRIDS))
    other = next(
        name
        for name in METHODS
        if name not in toy_sweep.GRIDS
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
