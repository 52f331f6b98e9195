"""`benchmarks/gpu_runbook.sh --dry-run`: every stage of the GPU runbook at toy sizes on the CPU, so that a GPU's time
goes to measuring. The report must hold the command, the versions, the device line and every stage's table."""

import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import psutil
import pytest
from _support.watchdog import run_watched, survivors


ROOT = Path(__file__).resolve().parents[2]


def unpack_baseline(folder: Path) -> Path:
    """The committed library as the runbook's header says to unpack a baseline: ``git archive`` and its REVISION."""
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    (folder / "REVISION").write_text(revision.stdout)
    return folder


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_runbook_dry_run_writes_the_report(tmp_path):
    """Every stage, and with --baseline the baseline's own benchmarks with its own package (checked by its path)."""
    baseline = unpack_baseline(tmp_path / "baseline")
    out = tmp_path / "out"
    proc = run_runbook(["--dry-run", "--out", str(out), "--baseline", str(baseline)])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (report,) = out.glob("dry-run-cpu-*.md")
    text = report.read_text()
    for line in ("* command: `bash benchmarks/gpu_runbook.sh --dry-run", "* device: CPU dry run", "* versions: "):
        assert line in text, line
    assert "8 passed" in text, text
    assert "| defaults | " in text and "| = kthvalue |" in text and "**wrong**" not in text, text
    for method in (
        "naive full logits",
        "AEnt reference",
        "TRL fused head",
        "Liger chunked GRPO",
        "the four LM-head GEMMs",
    ):
        assert f"| {method}" in text, method
    assert "| ours, torch path |" in text and "| ours, torch path, clamp 0 |" in text
    assert "| ours, torch path, 64,16,512: own CPU time | calls | ms | share |" in text, text
    for trainer in ("trl", "base", "aent", "clip_cov", "kl_cov", "repo", "adapo"):
        assert f"\n| {trainer} | " in text, trainer
    assert "failed" not in text, text
    revision = (baseline / "REVISION").read_text().strip()
    assert f"| baseline library | {baseline}/trl_entropy/__init__.py |" in text, text
    kernel, step = (
        text.split(f"## {stage}, baseline {revision}")[1]
        for stage in ("Kernel benchmark (dry run)", "Trainer loss step (dry run: toy Qwen2)")
    )
    assert f"`env PYTHONPATH={baseline}" in kernel and "| ours, torch path, clamp 0 |" in kernel
    assert "\n| aent | " in step.split("\n## ")[0]


def run_runbook(args, env=None):
    return run_watched(
        ["bash", str(ROOT / "benchmarks" / "gpu_runbook.sh"), *args],
        f"gpu_runbook.sh {' '.join(args)}",
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable, **(env or {})},
    )


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and timeout")
def test_gpu_runbook_keeps_to_its_budget(tmp_path):
    """A stage still running when the budget is spent is stopped (its process group with it) and marked cut; the
    stages after it are listed as not run. The step benchmark is made to outlast the budget by construction: the
    interpreter the runbook is given sleeps 5 minutes before that script, in a child, and notes its process ids and
    the sleep's end. Stopped, the stage never notes the end, however slow the machine: waited for, it would."""
    slow, noted = tmp_path / "python", tmp_path / "noted"
    slow.write_text(
        f'#!/usr/bin/env bash\ncase "$*" in *step_bench*) echo $$ >> {noted}; sleep 300 & echo $! >> {noted}; wait; '
        f'echo slept >> {noted} ;; esac\nexec "{sys.executable}" "$@"\n'
    )
    slow.chmod(0o755)
    out = tmp_path / "out"
    proc = run_runbook(
        ["--dry-run", "--out", str(out), "--budget", "5", "--stages", "step,sweep"], env={"PYTHON": str(slow)}
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wrapper, sleep, *after = noted.read_text().split()
    assert after == [], after  # the sleep's end never noted: the stage was stopped at the budget, not waited for
    stage = [psutil.Process(int(pid)) for pid in (wrapper, sleep) if psutil.pid_exists(int(pid))]
    assert survivors(stage) == []  # the stage's processes, the sleep in its group included
    (report,) = out.glob("dry-run-cpu-*.md")
    text = report.read_text()
    assert "* budget: 5 s; stages: step,sweep" in text, text
    step, sweep = text.split("## Trainer loss step")[1], text.split("## Clamp selection sizes")[1]
    assert "**cut at the budget** of 5 s" in step.split("\n## ")[0], text
    assert "**not run**: the budget of 5 s was spent" in sweep.split("\n## ")[0], text
    assert "* cut at the budget: Trainer loss step" in text and "* not run (budget spent): Clamp selection" in text
    for stage in ("CUDA kernel tests", "Kernel benchmark", "Kernel profile"):  # not named in --stages
        assert f"## {stage}" not in text, stage


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--stages", "tests,kernels"], "--stages: unknown stage 'kernels'; the stages are tests,kernel,"),
        (["--budget", "8m"], "--budget takes whole seconds, got '8m'"),
    ],
)
def test_gpu_runbook_refuses_bad_arguments(tmp_path, args, message):
    proc = run_runbook(["--dry-run", "--out", str(tmp_path), *args])
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not list(tmp_path.glob("*.md"))
