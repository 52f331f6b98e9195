"""`trl-entropy report`: the panels drawn and left out, and the numbers of report.md, checked against the log they come
from, on hand-written logs and on the logs of short real runs of every trainer, plain `trl.GRPOTrainer` and a run with
`PassAtKCallback`; the folder errors; the plot extra, and what the report and the demo do without matplotlib.

The entropy–reward law is checked against a least-squares fit written here (numpy's lstsq on [exp(H), 1]), not the
library's own.
"""

import ast
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _support.grpo import toy_config, toy_trainer
from _support.watchdog import run_watched
from trl import GRPOConfig, GRPOTrainer

from trl_entropy import (
    ADAPOConfig,
    ADAPOTrainer,
    AEntConfig,
    AEntTrainer,
    ClipCovConfig,
    ClipCovTrainer,
    EntropyGRPOConfig,
    EntropyGRPOTrainer,
    KLCovConfig,
    KLCovTrainer,
    PassAtKCallback,
    REPOConfig,
    REPOTrainer,
)
from trl_entropy.cli import main as trl_entropy_command
from trl_entropy.methods import SPECS
from trl_entropy.report import controller_panels, moving_average, read_run, write_report
from trl_entropy.scripts.report import main
from trl_entropy.toy import build_toy_dataset


ROOT = Path(__file__).resolve().parents[2]
ENTROPY_PANEL, REWARD_PANEL = "Entropy against the step", "Reward against the step"
LAW_PANEL = "Entropy–reward law R = −a·exp(H) + b"
PASS_PANELS = ["pass@k against k (last evaluation)", "pass@k against the step"]
TITLES = {panel.key: panel.title for panel in controller_panels()}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------------


def write_state(folder: Path, history: list[dict], global_step: int | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    steps = [entry["step"] for entry in history if "step" in entry]
    state = {"global_step": global_step if global_step is not None else max(steps, default=0), "log_history": history}
    (folder / "trainer_state.json").write_text(json.dumps(state))
    return folder


def tables(markdown: str) -> dict[str, list[dict[str, str]]]:
    """Every table of report.md under its `## heading`, as rows of {column: cell}."""
    found, heading, lines = {}, None, markdown.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("## "):
            heading = line[3:]
        elif line.startswith("| ") and heading is not None and heading not in found:
            header = [cell.strip() for cell in line.strip("|").split("|")]
            rows, index = [], index + 2  # skip the |---| line
            while index < len(lines) and lines[index].startswith("| "):
                rows.append(dict(zip(header, (cell.strip() for cell in lines[index].strip("|").split("|")))))
                index += 1
            found[heading] = rows
            continue
        index += 1
    return found


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", path
    return struct.unpack(">II", data[16:24])


def check_png(report) -> None:
    """A PNG whose size is the grid of the panels drawn: 3 across at most, 432 × 312 pixels each, plus the title."""
    width, height = png_size(report.png)
    columns = min(3, len(report.panels))
    rows = -(-len(report.panels) // columns)
    assert width == 432 * columns
    assert 312 * rows < height <= 312 * rows + 60


def logged(history: list[dict], key: str) -> list[float]:
    return [entry[key] for entry in history if isinstance(entry.get(key), (int, float)) and math.isfinite(entry[key])]


def number(cell: str) -> float:
    return float(cell)


def independent_law(entropies, rewards) -> tuple[float, float, float]:
    """a, b and R² of R = −a·exp(H) + b by numpy least squares on the design matrix [exp(H), 1]."""
    design = np.stack([np.exp(entropies), np.ones(len(entropies))], axis=1)
    (slope, intercept), *_ = np.linalg.lstsq(design, rewards, rcond=None)
    predicted = design @ np.array([slope, intercept])
    r_squared = 1 - np.sum((rewards - predicted) ** 2) / np.sum((rewards - np.mean(rewards)) ** 2)
    return -slope, intercept, r_squared


def synthetic_history(num_steps=60, seed=0, pass_at_k_every=20, controllers=True) -> list[dict]:
    """A run's log as the Trainer writes it: one entry per logging step, pass@k entries, the final summary."""
    rng = np.random.default_rng(seed)
    history = []
    for step in range(1, num_steps + 1):
        entropy = 0.15 + 0.6 * math.exp(-step / 25) + rng.normal(0, 0.01)
        entry = {"loss": 0.01, "entropy": entropy, "reward": 1.4 - 0.6 * math.exp(entropy) + rng.normal(0, 0.02)}
        if controllers:
            entry |= {"aent/coef": 1e-3 * (1 + step % 7), "repo/beta": 0.01 * step, "repo/entropy_target": 0.4}
        history.append(entry | {"epoch": step / num_steps, "step": step})
        if pass_at_k_every and step % pass_at_k_every == 0:
            values = {f"eval/pass@{k}": min(1.0, 0.2 + 0.1 * k + step / 1000) for k in (1, 2, 4, 8)}
            history.append(values | {"epoch": step / num_steps, "step": step})
    history.append({"train_runtime": 1.0, "train_loss": 0.01, "epoch": 1.0, "step": num_steps})
    return history


# ---------------------------------------------------------------------------------------------------------------------
# Hand-written logs
# ---------------------------------------------------------------------------------------------------------------------


def test_synthetic_log_panels_and_numbers(tmp_path):
    history = synthetic_history()
    run = write_state(tmp_path / "my-run", history)
    report = write_report(run)
    assert report.png == run / "report.png" and report.markdown == run / "report.md"  # beside the log
    assert report.panels == [
        ENTROPY_PANEL,
        REWARD_PANEL,
        TITLES["aent/coef"],
        TITLES["repo/beta"],
        LAW_PANEL,
        *PASS_PANELS,
    ]
    assert report.left_out == []
    check_png(report)

    found = tables(report.markdown.read_text())
    assert found["Runs"] == [
        {
            "run": "my-run",
            "log read": "`trainer_state.json`",
            "log entries": str(len(history)),
            "last step": "60",
            "smoothing window": "6",
        }
    ]
    (row,) = found["Entropy and reward (logged values)"]
    for key in ("entropy", "reward"):
        values = logged(history, key)
        expected = {"first": values[0], "last": values[-1], "min": min(values), "max": max(values)}
        for column, value in expected.items():
            assert number(row[f"{key} {column}"]) == pytest.approx(value, rel=1e-3)

    (law,) = found["Entropy–reward law R = −a·exp(H) + b"]
    a, b, r_squared = independent_law(np.array(logged(history, "entropy")), np.array(logged(history, "reward")))
    assert number(law["a"]) == pytest.approx(a, rel=1e-3) and number(law["b"]) == pytest.approx(b, rel=1e-3)
    assert number(law["ceiling b − a"]) == pytest.approx(b - a, rel=1e-3)
    assert number(law["R²"]) == pytest.approx(r_squared, rel=1e-3)
    assert law["points"] == "60" and law["fit"] == "fitted"
    assert a == pytest.approx(0.6, rel=0.1)  # the law the log was made with
    fit = report.laws["my-run"]
    assert fit.law.a == pytest.approx(a, rel=1e-9) and fit.law.b == pytest.approx(b, rel=1e-9)

    controllers = {(row["metric"], row["run"]): row for row in found["Controllers (logged values)"]}
    assert set(controllers) == {("aent/coef", "my-run"), ("repo/beta", "my-run")}
    for key in ("aent/coef", "repo/beta"):
        values = logged(history, key)
        for column, value in {"first": values[0], "last": values[-1], "min": min(values), "max": max(values)}.items():
            assert number(controllers[key, "my-run"][column]) == pytest.approx(value, rel=1e-3)

    evaluations = found["pass@k (held-out)"]
    assert [row["step"] for row in evaluations] == ["20", "40", "60"]
    for row in evaluations:
        entry = next(e for e in history if e["step"] == int(row["step"]) and "eval/pass@1" in e)
        for k in (1, 2, 4, 8):
            assert number(row[f"pass@{k}"]) == pytest.approx(entry[f"eval/pass@{k}"], rel=1e-3)


@pytest.mark.parametrize(
    "spec", [spec for spec in SPECS if any(metric.title for metric in spec.metrics)], ids=lambda spec: spec.key
)
def test_every_methods_titled_metrics_get_their_panels(spec, tmp_path):
    """Each method's declared metrics with a title, logged, get their panels, in the declaration's order."""
    titled = [metric for metric in spec.metrics if metric.title]
    history = synthetic_history(num_steps=12, pass_at_k_every=0, controllers=False)
    for step, entry in enumerate((entry for entry in history if "entropy" in entry), start=1):
        entry.update({metric.key: 0.01 * step * (index + 1) for index, metric in enumerate(titled)})
    report = write_report(write_state(tmp_path / spec.key, history))
    assert report.panels == [ENTROPY_PANEL, REWARD_PANEL, *(metric.title for metric in titled), LAW_PANEL]
    check_png(report)


def test_law_of_the_library_callback_is_quoted(tmp_path):
    history = synthetic_history(num_steps=12, pass_at_k_every=0, controllers=False)
    history.insert(-1, {"entropy/law_a": 0.5, "entropy/law_b": 1.25, "entropy/predicted_ceiling": 0.75, "step": 12})
    report = write_report(write_state(tmp_path / "run", history))
    (law,) = tables(report.markdown.read_text())["Entropy–reward law R = −a·exp(H) + b"]
    assert law["logged by EntropyLawCallback (last)"] == "a = 0.5, b = 1.25 at step 12"


@pytest.mark.parametrize(
    ("entropies", "reason"),
    [
        ([0.5, 0.4, 0.3, 0.35, 0.2], "5 (entropy, reward) points, the fit needs 10"),
        ([0.4] * 20, "the entropy barely varies (std of exp(H) is 0.00% of its mean, the fit needs 1%)"),
    ],
    ids=["too-few-points", "one-entropy"],
)
def test_degenerate_law_is_not_drawn_and_says_why(entropies, reason, tmp_path):
    history = [{"entropy": h, "reward": 0.1 * i, "step": i + 1} for i, h in enumerate(entropies)]
    report = write_report(write_state(tmp_path / "flat", history))
    assert LAW_PANEL in report.panels  # the scatter is drawn
    assert report.laws["flat"].law is None and report.laws["flat"].reason == reason
    assert f"entropy–reward law of flat: no fit drawn, {reason}" in report.left_out
    (law,) = tables(report.markdown.read_text())["Entropy–reward law R = −a·exp(H) + b"]
    assert law["a"] == law["b"] == "n/a" and law["fit"] == f"no fit: {reason}"
    assert law["points"] == str(len(entropies))
    check_png(report)


def test_missing_metrics_leave_their_panels_out(tmp_path):
    # Entropy only: no reward panel, no law, no controllers, no pass@k, one line each.
    report = write_report(
        write_state(tmp_path / "entropy-only", [{"entropy": 0.5 - 0.01 * s, "step": s} for s in range(1, 6)])
    )
    assert report.panels == [ENTROPY_PANEL]
    assert report.left_out == [
        "reward: left out, the run did not log 'reward'",
        f"controllers: left out, the run did not log any of {', '.join(TITLES)}",
        "entropy–reward law: left out, the run did not log 'entropy' and 'reward' together",
        "pass@k: left out, the run did not log eval/pass@k (trl_entropy.PassAtKCallback logs it)",
    ]
    markdown = report.markdown.read_text()
    assert all(f"* {line}" in markdown for line in report.left_out)
    check_png(report)
    # Nothing to draw: a picture saying so, never an empty axis.
    empty = write_report(write_state(tmp_path / "loss-only", [{"loss": 0.1, "step": 1}]))
    assert empty.panels == ["Nothing to draw"] and len(empty.left_out) == 5
    assert png_size(empty.png)[0] == 432


def test_moving_average_against_a_direct_sum():
    values = [0.5, 0.1, 0.9, 0.3, 0.7, 0.2]
    for window in (1, 2, 4, 10):
        expected = [np.mean(values[max(0, i - window + 1) : i + 1]) for i in range(len(values))]
        np.testing.assert_allclose(moving_average(values, window), expected, rtol=1e-12)
    with pytest.raises(ValueError, match="window must be at least 1"):
        moving_average(values, 0)


def test_the_latest_checkpoint_is_read(tmp_path):
    run = tmp_path / "run"
    for step in (2, 9, 10):  # checkpoint-10 is the latest, though "checkpoint-9" sorts after it as text
        write_state(
            run / f"checkpoint-{step}", [{"entropy": 0.5, "reward": 0.1, "step": s} for s in range(1, step + 1)]
        )
    (run / "checkpoint-11").mkdir()  # a checkpoint folder without a state (an interrupted save) is passed over
    log = read_run(run)
    assert log.source == run / "checkpoint-10" / "trainer_state.json" and len(log.history) == 10
    write_state(run, [{"entropy": 0.5, "step": 1}], global_step=1)  # an older save_state() than the checkpoints
    assert read_run(run).source == run / "checkpoint-10" / "trainer_state.json"
    write_state(run, [{"entropy": 0.5, "step": s} for s in range(1, 11)], global_step=10)  # as recent: its own
    assert read_run(run).source == run / "trainer_state.json"


def test_folders_without_a_log_history_are_errors(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit) as exit_info:
        trl_entropy_command(["report", str(empty)])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert f"{empty}: no log history: looked for {empty / 'trainer_state.json'} and " in error
    assert str(empty / "checkpoint-*" / "trainer_state.json") in error
    assert not (empty / "report.md").exists()

    write_state(tmp_path / "no-logs", [])
    with pytest.raises(SystemExit):
        main([str(tmp_path / "no-logs")])
    assert "trainer_state.json: no log history (its 'log_history' is missing or empty" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing")])
    assert f"{tmp_path / 'missing'}: no such folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(empty), "--smoothing", "0"])
    assert "--smoothing must be at least 1 logged value, got 0" in capsys.readouterr().err
    run = write_state(tmp_path / "run", [{"entropy": 0.5, "step": 1}])
    with pytest.raises(SystemExit):
        main([str(run), str(run / "trainer_state.json")])
    assert "the same log was given more than once" in capsys.readouterr().err


def test_command_line_output_folder_and_smoothing(tmp_path, capsys):
    run = write_state(tmp_path / "run", synthetic_history(num_steps=30, pass_at_k_every=0))
    assert trl_entropy_command(["report", str(run), "--output", str(tmp_path / "out"), "--smoothing", "3"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {tmp_path / 'out' / 'report.png'} and {tmp_path / 'out' / 'report.md'}" in printed
    assert "trl-entropy report: pass@k: left out, the run did not log eval/pass@k" in printed
    (row,) = tables((tmp_path / "out" / "report.md").read_text())["Runs"]
    assert row["smoothing window"] == "3" and row["log read"] == "`../run/trainer_state.json`"
    assert not (run / "report.md").exists()


def test_the_plot_extra_and_the_console_script_are_declared():
    tree = ast.parse((ROOT / "setup.py").read_text())
    keywords = {
        node.arg: ast.literal_eval(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.keyword) and node.arg in ("extras_require", "entry_points")
    }
    assert keywords["extras_require"]["plot"] == ["matplotlib"]
    assert "matplotlib" in keywords["extras_require"]["dev"]  # the tests draw
    assert "trl-entropy = trl_entropy.cli:main" in keywords["entry_points"]["console_scripts"]
    readme = (ROOT / "README.md").read_text()
    assert 'pip install -e ".[plot]"' in readme


# ---------------------------------------------------------------------------------------------------------------------
# Without matplotlib
# ---------------------------------------------------------------------------------------------------------------------


# Unimportable besides matplotlib: what a command must not reach before it stops for matplotlib (the slow imports).
SLOW_IMPORTS = ("torch", "transformers", "trl")


def run_without_matplotlib(arguments: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """Run ``python ARGUMENTS`` with a ``matplotlib`` first on the path that fails to import, as when it is missing,
    and so do the ``SLOW_IMPORTS``: a command that reached one before its check would fail with that one's error."""
    for name in ("matplotlib", *SLOW_IMPORTS):
        blocker = tmp_path / "blocker" / name
        blocker.mkdir(parents=True, exist_ok=True)
        (blocker / "__init__.py").write_text(f"raise ImportError(\"No module named '{name}'\")\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "blocker"), OMP_NUM_THREADS="1")
    return run_watched([sys.executable, *arguments], f"python {' '.join(arguments)}", cwd=tmp_path, env=env)


def test_without_matplotlib_the_report_and_the_demo_stop_naming_the_extra(tmp_path):
    """Each stops before the slow imports (by construction: they fail to import here), reading nothing, training
    nothing."""
    run = write_state(tmp_path / "run", synthetic_history(num_steps=12))
    report = run_without_matplotlib(["-m", "trl_entropy.report", str(run)], tmp_path)
    demo_dir = tmp_path / "demo"
    demo = run_without_matplotlib(
        [str(ROOT / "examples" / "entropy_collapse_demo.py"), "--output_dir", str(demo_dir)], tmp_path
    )
    command = run_without_matplotlib(["-m", "trl_entropy.cli", "demo", "--output_dir", str(demo_dir)], tmp_path)
    for result in (report, demo, command):
        assert result.returncode == 2, result.stderr[-2000:]
        assert "Install the 'plot' extra: pip install -e \".[plot]\"" in result.stderr
        assert "No module named 'matplotlib'" in result.stderr and "Traceback" not in result.stderr
    assert demo.stderr.startswith("entropy_collapse_demo.py: error: the demo draws its curves with matplotlib")
    assert command.stderr.startswith("trl-entropy demo: error: the demo draws its curves with matplotlib")
    assert not (run / "report.md").exists() and not demo_dir.exists()  # stopped before reading or training


# ---------------------------------------------------------------------------------------------------------------------
# Logs of real runs: every trainer, plain trl.GRPOTrainer, a run with PassAtKCallback (2 optimizer steps each)
# ---------------------------------------------------------------------------------------------------------------------

# name: (trainer, config, options, the controller key it logs)
RUNS = {
    "grpo": (GRPOTrainer, GRPOConfig, {}, None),
    "entreg": (
        EntropyGRPOTrainer,
        EntropyGRPOConfig,
        {"entropy_coef": 1e-3, "use_adaptive_entropy": True},
        "entropy_coef",
    ),
    "aent": (AEntTrainer, AEntConfig, {}, "aent/coef"),
    "clip_cov": (ClipCovTrainer, ClipCovConfig, {"num_iterations": 2}, "clip_cov/detached_fraction"),
    "kl_cov": (KLCovTrainer, KLCovConfig, {"num_iterations": 2}, "kl_cov/penalised_fraction"),
    "repo": (REPOTrainer, REPOConfig, {}, "repo/beta"),
    # Checkpoints only (no save_state): the report reads the latest one.
    "adapo": (
        ADAPOTrainer,
        ADAPOConfig,
        {"num_iterations": 2, "save_strategy": "steps", "save_steps": 1},
        "adapo/epsilon_high",
    ),
    "pass_at_k": (GRPOTrainer, GRPOConfig, {"eval_strategy": "steps", "eval_steps": 1}, None),
}


@pytest.fixture(scope="module")
def trained_runs(warm_toy_policy_path, tmp_path_factory):
    """{name: (run folder, the trainer's in-memory log history)} for every run of RUNS."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("report_runs")
    tokenizer = AutoTokenizer.from_pretrained(warm_toy_policy_path)
    runs = {}
    for name, (trainer_class, config_class, options, _) in RUNS.items():
        args = toy_config(
            config_class,
            root / name,
            max_steps=2,
            per_device_train_batch_size=8,
            per_device_eval_batch_size=8,
            num_generations=4,
            max_completion_length=8,
            learning_rate=1e-4,
            logging_steps=1,
            disable_tqdm=True,
            **{"save_strategy": "no", **options},
        )
        trainer = toy_trainer(
            trainer_class,
            args,
            warm_toy_policy_path,
            tokenizer,
            train_dataset=build_toy_dataset(16, seed=0),
            eval_dataset=build_toy_dataset(4, seed=0, split="test") if name == "pass_at_k" else None,
        )
        if name == "pass_at_k":
            trainer.add_callback(PassAtKCallback(trainer, num_samples=4))
        trainer.train()
        if args.save_strategy == "no":
            trainer.save_state()
        runs[name] = (root / name, trainer.state.log_history)
    return runs


@pytest.mark.parametrize("name", list(RUNS))
def test_report_on_a_real_run(name, trained_runs):
    folder, history = trained_runs[name]
    controller = RUNS[name][3]
    report = write_report(folder)
    expected = [ENTROPY_PANEL, REWARD_PANEL, *([TITLES[controller]] if controller else []), LAW_PANEL]
    assert report.panels == expected + (PASS_PANELS if name == "pass_at_k" else [])
    points = len([entry for entry in history if "entropy" in entry and "reward" in entry])
    reason = f"{points} (entropy, reward) point{'s' * (points != 1)}, the fit needs 10"
    assert f"entropy–reward law of {name}: no fit drawn, {reason}" in report.left_out  # 2 steps: too few points
    assert any(line.startswith("controllers: left out") for line in report.left_out) == (controller is None)
    assert any(line.startswith("pass@k: left out") for line in report.left_out) == (name != "pass_at_k")
    check_png(report)

    found = tables(report.markdown.read_text())
    (run_row,) = found["Runs"]
    source = "checkpoint-2/trainer_state.json" if name == "adapo" else "trainer_state.json"
    assert run_row["log read"] == f"`{source}`" and run_row["last step"] == "2"
    # A checkpoint is written before the Trainer logs its end-of-training summary.
    in_file = [entry for entry in history if name != "adapo" or "train_runtime" not in entry]
    assert run_row["log entries"] == str(len(in_file))
    (row,) = found["Entropy and reward (logged values)"]
    for key in ("entropy", "reward"):
        values = logged(history, key)
        assert number(row[f"{key} first"]) == pytest.approx(values[0], rel=1e-3)
        assert number(row[f"{key} last"]) == pytest.approx(values[-1], rel=1e-3)
    if controller:
        (controller_row,) = found["Controllers (logged values)"]
        values = logged(history, controller)
        assert controller_row["metric"] == controller and len(values) == 2
        assert number(controller_row["last"]) == pytest.approx(values[-1], rel=1e-3, abs=1e-12)
    if name == "pass_at_k":
        evaluations = [entry for entry in history if "eval/pass@1" in entry]
        rows = found["pass@k (held-out)"]
        assert [row["step"] for row in rows] == [str(entry["step"]) for entry in evaluations] == ["1", "2"]
        for row, entry in zip(rows, evaluations):
            for k in (1, 2, 4):
                assert number(row[f"pass@{k}"]) == pytest.approx(entry[f"eval/pass@{k}"], rel=1e-3, abs=1e-12)


def test_report_on_several_runs(trained_runs, tmp_path, capsys):
    folders = [str(trained_runs[name][0]) for name in RUNS]
    assert trl_entropy_command(["report", *folders, "--output", str(tmp_path / "all")]) == 0
    printed = capsys.readouterr().out
    drawn = printed.splitlines()[0]
    for title in [ENTROPY_PANEL, REWARD_PANEL, *(TITLES[RUNS[name][3]] for name in RUNS if RUNS[name][3])]:
        assert title in drawn
    assert LAW_PANEL in drawn and all(title in drawn for title in PASS_PANELS)
    assert (
        "trl-entropy report: aent/coef: not logged by grpo, entreg, clip_cov, kl_cov, repo, adapo, pass_at_k"
        in printed
    )
    found = tables((tmp_path / "all" / "report.md").read_text())
    assert [row["run"] for row in found["Runs"]] == list(RUNS)  # one row, one colour a run, named by folder
    controllers = {row["metric"]: row["run"] for row in found["Controllers (logged values)"]}
    assert controllers == {RUNS[name][3]: name for name in RUNS if RUNS[name][3]}
    assert {row["run"] for row in found["pass@k (held-out)"]} == {"pass_at_k"}
    # Without --output, several runs go to their common parent folder.
    report = write_report([trained_runs["grpo"][0], trained_runs["aent"][0]])
    assert report.png == trained_runs["grpo"][0].parent / "report.png"
    width, _ = png_size(report.png)
    assert width == 432 * 3


# ---------------------------------------------------------------------------------------------------------------------
# The entropy-collapse demo's output folder, built by hand as examples/entropy_collapse_demo.py lays it out
# ---------------------------------------------------------------------------------------------------------------------


def demo_evaluation(step: int, offset: float) -> dict:
    """The held-out evaluation the demo logs at a run's last step: its task's pass@k and the other task's."""
    entry = {f"eval/pass@{k}": round(offset + 0.1 * k, 3) for k in (1, 2, 4)}
    return entry | {f"eval/subtraction/pass@{k}": round(offset / 2 + 0.1 * k, 3) for k in (1, 2, 4)} | {"step": step}


def write_demo_folder(root: Path, seeds=(0,), names=("grpo", "aent")) -> Path:
    """history.json (its run order) and, per seed, the start policy's evaluation and each run's two phases."""
    root.mkdir(parents=True)
    (root / "history.json").write_text(json.dumps({"runs": {name: {"method": name} for name in names}}))
    for seed in seeds:
        write_state(root / f"seed{seed}" / "start", [demo_evaluation(0, 0.3)])
        (root / f"seed{seed}" / "initial_policy").mkdir()  # weights only: not a run
        for index, name in enumerate(names):
            for phase in (1, 2):
                history = synthetic_history(num_steps=30, seed=index, pass_at_k_every=0, controllers=False)
                write_state(
                    root / f"seed{seed}" / name / f"phase{phase}", [*history, demo_evaluation(30, 0.1 * index)]
                )
    return root


def test_report_reads_the_demo_folder_as_one_seeds_runs(tmp_path, capsys):
    demo = write_demo_folder(tmp_path / "demo")
    seed = demo / "seed0"
    for folder in (demo, seed):
        assert trl_entropy_command(["report", str(folder)]) == 0
        printed = capsys.readouterr().out
        assert (
            f"trl-entropy report: read {seed}: the demo's phase-1 runs (grpo, aent) and the start policy's evaluation "
            f"(start); for phase 2 (task B) pass {seed / '*' / 'phase2'}\n" in printed
        )
        assert all(title in printed.splitlines()[1] for title in (ENTROPY_PANEL, LAW_PANEL, *PASS_PANELS))
        found = tables((seed / "report.md").read_text())  # written into the seed's folder
        assert [row["run"] for row in found["Runs"]] == ["seed0/start", "grpo/phase1", "aent/phase1"]
        passes = {row["run"]: row for row in found["pass@k (held-out)"]}
        for name, step, offset in (("seed0/start", 0, 0.3), ("grpo/phase1", 30, 0.0), ("aent/phase1", 30, 0.1)):
            expected = demo_evaluation(step, offset)
            assert number(passes[name]["step"]) == step
            assert [number(passes[name][f"pass@{k}"]) for k in (1, 2, 4)] == pytest.approx(
                [expected[f"eval/pass@{k}"] for k in (1, 2, 4)], abs=5e-4
            )
        (seed / "report.md").unlink()

    # One run's folder: its two phases; one phase's folder: that run alone.
    report = write_report(seed / "grpo")
    assert [run.name for run in report.runs] == ["phase1", "phase2"] and report.png == seed / "grpo" / "report.png"
    assert report.notes == [f"{seed / 'grpo'}: the demo run's phases phase1, phase2"]
    report = write_report(seed / "aent" / "phase2")
    assert [run.name for run in report.runs] == ["phase2"] and report.notes == []
    assert all(title in report.panels for title in PASS_PANELS)


def test_report_names_the_seed_folders_of_a_demo_with_several(tmp_path, capsys):
    demo = write_demo_folder(tmp_path / "demo", seeds=(0, 1, 2))
    with pytest.raises(SystemExit) as exit_info:
        trl_entropy_command(["report", str(demo)])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert (
        f"{demo} holds the entropy-collapse demo's runs of 3 seeds; the report overlays one seed's runs: pass one of "
        f"{demo / 'seed0'}, {demo / 'seed1'}, {demo / 'seed2'} (e.g. trl-entropy report {demo / 'seed0'})" in error
    )
    assert not list(demo.rglob("report.md"))
    assert trl_entropy_command(["report", str(demo / "seed2")]) == 0
    assert (demo / "seed2" / "report.md").is_file()
