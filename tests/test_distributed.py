"""Two processes (``accelerate launch``, gloo on the CPU) against one process with the same global batch.

Each adaptive trainer (AEnt, REPO-R, REPO-D, ADAPO) trains three optimizer steps on two ranks with 4 completions each
and on one process with 8. Completions come from ``distributed_run.deterministic_rollout`` (a fixed function of the
prompt), so both runs score the same completions; the rest is the trainers' own: scoring, advantages, loss, DDP's
gradient all-reduce, the controller statistic reduced across ranks, and the controller update. Every rank must hold
the same controller value after every step, and the two-process run must reproduce the one-process run.
"""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from distributed_run import ADAPTIVE_METHODS, run


HERE = Path(__file__).resolve().parent
STEPS = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def read(folder, method, rank):
    with open(os.path.join(folder, f"{method}_rank{rank}.json")) as file:
        return json.load(file)


@pytest.fixture(scope="module")
def runs(warm_toy_policy_path, tmp_path_factory):
    """``{method: (one_process_record, [rank0_record, rank1_record])}``."""
    two = tmp_path_factory.mktemp("two_processes")
    env = dict(
        os.environ,
        CUDA_VISIBLE_DEVICES="",  # the CPU even where a GPU exists: `--multi_gpu` only selects torchrun's launcher
        OMP_NUM_THREADS="1",
        TRL_EXPERIMENTAL_SILENCE="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
    )
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",  # torchrun with two local processes; without CUDA each process uses the CPU and gloo
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        str(HERE / "distributed_run.py"),
        "--model",
        warm_toy_policy_path,
        "--out",
        str(two),
        "--methods",
        ",".join(ADAPTIVE_METHODS),
        "--per-device-batch-size",
        "4",
        "--steps",
        str(STEPS),
    ]
    log_path = two / "launch.log"
    with open(log_path, "w") as log:
        launched = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            # The one-process run goes on here while the two ranks run.
            one = tmp_path_factory.mktemp("one_process")
            for method in ADAPTIVE_METHODS:
                run(method, warm_toy_policy_path, str(one), per_device_batch_size=8, steps=STEPS)
            launched.wait(timeout=600)
        finally:
            if launched.poll() is None:  # a failure here, or a hung rank: stop the launcher and both ranks
                os.killpg(launched.pid, signal.SIGKILL)
                launched.wait()
    assert launched.returncode == 0, log_path.read_text()[-6000:]
    return {
        method: (read(one, method, 0), [read(two, method, rank) for rank in (0, 1)]) for method in ADAPTIVE_METHODS
    }


@pytest.mark.parametrize("method", ADAPTIVE_METHODS)
def test_every_rank_holds_the_same_controller_value(runs, method):
    _, ranks = runs[method]
    assert [record["num_processes"] for record in ranks] == [2, 2]
    values = [record["controller"] for record in ranks]
    assert len(values[0]) == STEPS
    assert values[0] == values[1]  # bit for bit: both ranks update from the same all-reduced statistic
    assert len(set(values[0])) > 1, f"{method}'s controller never moved: the check would be vacuous"
    assert ranks[0]["loss"] == ranks[1]["loss"] and ranks[0]["entropy"] == ranks[1]["entropy"]
    # DDP keeps the replicas identical.
    assert ranks[0]["weights_head"] == ranks[1]["weights_head"]
    assert ranks[0]["weights_sum"] == ranks[1]["weights_sum"]


@pytest.mark.parametrize("method", ADAPTIVE_METHODS)
def test_two_processes_reproduce_one_process(runs, method):
    one, (rank0, _) = runs[method]
    assert one["num_processes"] == 1
    assert rank0["reward"] == one["reward"]  # the same completions and rewards
    # Float tolerance: the all-reduce sums in another order than one process does.
    assert rank0["controller"] == pytest.approx(one["controller"], rel=1e-6, abs=1e-9)
    assert rank0["entropy"] == pytest.approx(one["entropy"], rel=1e-5)
    assert rank0["loss"] == pytest.approx(one["loss"], rel=1e-4, abs=1e-6)
    assert rank0["weights_head"] == pytest.approx(one["weights_head"], rel=1e-4, abs=1e-6)
    assert rank0["weights_abs_sum"] == pytest.approx(one["weights_abs_sum"], rel=1e-6)
