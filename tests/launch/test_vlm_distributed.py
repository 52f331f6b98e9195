"""Two processes (``accelerate launch``, DDP with gloo on the CPU) train a tiny Qwen2-VL as one process does with the
same global batch: every adaptive trainer (a controller, its statistic reduced across ranks) and the base with control
off. Completions
come from ``vlm.vlm_rollout`` (fixed per image), so both layouts score the same completions of the same images; two
ranks with 4 completions each must reproduce one process with 8: rewards, losses, entropies, the controller after
every step, and the weights (the vision tower's included) after three optimizer steps."""

import pytest
import torch
from _support import vlm_distributed_run
from _support.distributed_run import ADAPTIVE_METHODS, beside_two_processes
from _support.vlm_distributed_run import run


FAMILY, STEPS = "qwen2_vl", 3
METHODS = (*ADAPTIVE_METHODS, "grpo")
# As for the text-only toy (tests/launch/test_distributed.py): two ranks sum in another order than one process, and
# Adam's first steps carry that rounding into the weights.
WEIGHTS_ATOL = 1e-4


@pytest.fixture(scope="module")
def vlm_runs(two_ranks, tmp_path_factory):
    """``{method: ((one_process_record, weights), [(rank_record, weights) for both ranks])}``."""
    two = tmp_path_factory.mktemp("vlm_two_processes")
    options = ["--family", FAMILY, "--out", str(two), "--per-device-batch-size", "4", "--steps", str(STEPS)]
    job = two_ranks.submit(vlm_distributed_run.main, [*options, "--methods", ",".join(METHODS)])
    one = tmp_path_factory.mktemp("vlm_one_process")
    return beside_two_processes(
        job, two, one, METHODS, lambda method: run(FAMILY, method, str(one), per_device_batch_size=8, steps=STEPS)
    )


@pytest.mark.parametrize("method", METHODS)
def test_two_processes_train_a_vlm_as_one_process(vlm_runs, method):
    (one, one_weights), ((rank0, weights0), (rank1, weights1)) = vlm_runs[method]
    assert (one["num_processes"], rank0["num_processes"]) == (1, 2)
    assert rank0["distributed_type"] == "MULTI_CPU"
    assert rank0["reward"] == one["reward"]  # the same completions and rewards
    assert len(rank0["loss"]) == STEPS and len(set(one["loss"])) == STEPS
    assert rank0["loss"] == rank1["loss"] and rank0["controller"] == rank1["controller"]
    assert rank0["loss"] == pytest.approx(one["loss"], rel=1e-4, abs=1e-6)
    assert rank0["entropy"] == pytest.approx(one["entropy"], rel=1e-5)
    if method in ADAPTIVE_METHODS:
        assert rank0["controller"] == pytest.approx(one["controller"], rel=1e-6, abs=1e-9)
    assert max((weights0[name] - weights1[name]).abs().max().item() for name in weights0) == 0
    moved = [name for name in one_weights if "visual" in name]
    assert moved, "no vision-tower weight compared"
    for name, expected in one_weights.items():
        torch.testing.assert_close(weights0[name], expected, rtol=0, atol=WEIGHTS_ATOL, msg=name)


def test_the_controllers_move_on_the_vlm(vlm_runs):
    """The controller comparisons above are not vacuous: controllers move within the three steps."""
    moving = [method for method in ADAPTIVE_METHODS if len(set(vlm_runs[method][0][0]["controller"])) > 1]
    assert len(moving) >= 3, moving
