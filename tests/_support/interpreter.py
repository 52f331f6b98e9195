"""A kernel test file's Triton cases run again under the Triton interpreter, in a child process: Triton reads
``TRITON_INTERPRET`` when its kernels are first decorated, so this process (which may have compiled them already)
cannot switch."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]


def rerun_under_the_interpreter(test_file: str) -> None:
    """Run ``test_file`` with ``TRITON_INTERPRET=1`` in a child pytest and assert it passes (skipped where this process
    already interprets, running those cases itself, or where Triton is not installed)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the cases run in this process")
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    env = dict(os.environ, TRITON_INTERPRET="1")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file]
    process = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert process.returncode == 0, process.stdout[-8000:] + process.stderr[-4000:]
