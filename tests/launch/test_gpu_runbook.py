"""`benchmarks/gpu_runbook.sh --dry-run`: every stage of the GPU runbook at toy sizes on the CPU, so that a GPU's time
goes to measuring. The report must hold the command, the versions, the device line and every stage's table."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_runbook_dry_run_writes_the_report(tmp_path):
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_runbook.sh"), "--dry-run", "--out", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (report,) = tmp_path.glob("dry-run-cpu-*.md")
    text = report.read_text()
    for line in ("* command: `bash benchmarks/gpu_runbook.sh --dry-run", "* device: CPU dry run", "* versions: "):
        assert line in text, line
    assert "4 passed" in text, text
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
