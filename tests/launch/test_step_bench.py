"""`benchmarks/step_bench.py --preset smollm2 --dry-run` as a process: the real-checkpoint preset's path (the fetched
checkpoint, a batch the model samples on the chat task, a loss step of trl.GRPOTrainer and of the base trainer) at its
smallest batch, on the suite's cached SmolLM2-135M-Instruct. Its times mean nothing; the table's rows must be there."""

import sys
from pathlib import Path

from _support.watchdog import run_watched


ROOT = Path(__file__).resolve().parents[2]


def test_smollm2_preset_dry_run_times_trl_and_the_base_on_a_sampled_batch(smollm2_path):
    proc = run_watched(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "step_bench.py"),
            "--preset",
            "smollm2",
            "--dry-run",
            "--trainers",
            "trl,base",
            "--repeats",
            "1",
            "--threads",
            "1",  # a shared machine's cores: one thread waits on no other
            "--cache-dir",
            str(Path(smollm2_path).parent),  # fetch_model finds the suite's conversion there
        ],
        "step_bench.py --preset smollm2 --dry-run",
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    # The checkpoint's shape, one prompt's group of two completions of at most 4 tokens after the chat prompt
    assert "preset=smollm2 device=cpu dtype=fp32 vocab=49152 hidden=576 layers=30 batch=2x(" in out, out
    scored = int(out.split(" scored=")[1].split()[0])
    assert 2 <= scored <= 8, out
    assert "parameters: 134.52 M" in out, out
    assert "\n| trl | " in out and "\n| base | " in out, out
