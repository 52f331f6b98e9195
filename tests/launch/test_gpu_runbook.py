"""`benchmarks/gpu_runbook.sh --dry-run`: every stage of the GPU runbook at toy sizes on the CPU, so that a GPU's time
goes to measuring. The report must hold the command, the versions, the device line and every stage's table."""

import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest


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
    proc = subprocess.run(
        [
            "bash",
            str(ROOT / "benchmarks" / "gpu_runbook.sh"),
            "--dry-run",
            "--out",
            str(out),
            "--baseline",
            str(baseline),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (report,) = out.glob("dry-run-cpu-*.md")
    text = report.read_text()
    for line in ("* command: `bash benchmarks/gpu_runbook.sh --dry-run", "* device: CPU dry run", "* versions: "):
        assert line in text, line
    assert "6 passed" in text, text
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
