"""Two processes (``accelerate launch``, DDP with gloo on the CPU) train a tiny Qwen2-VL as one process does with the
same global batch: every adaptive trainer (a controller, its statistic reduced across ranks) and the base with control
off. Completions
come from ``vlm.vlm_rollout`` (fixed per image), so both layouts score the same completions of the same images; two
ranks with 4 completions each must reproduce one process with 8: rewards, losses, entropies, the controller after
every step, and the weights (the vision tower's included) after three optimizer steps."""

import pytest
from _support import vlm_distributed_run
from _support.distributed_run import ADAPTIVE_METHODS, beside_two_processes, check_controllers, paired_weights
from _support.rounding import TWO_PROCESS_CONTROLLERS as CONTROLLERS
from _support.rounding import TWO_PROCESS_ENTROPY as ENTROPY
from _support.rounding import TWO_PROCESS_LOSS as LOSS
from _support.rounding import TWO_PROCESS_WEIGHTS, check
from _support.vlm_distributed_run import run


FAMILY, STEPS = "qwen2_vl", 3
METHODS = (*ADAPTIVE_METHODS, "grpo")
WEIGHTS = TWO_PROCESS_WEIGHTS["vlm"]


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
    check(f"vlm loss[{method}]", rank0["loss"], one["loss"], LOSS)
    check(f"vlm entropy[{method}]", rank0["entropy"], one["entropy"], ENTROPY)
    if method in ADAPTIVE_METHODS:
        check_controllers("vlm", method, rank0, one, CONTROLLERS)
    assert max((weights0[name] - weights1[name]).abs().max().item() for name in weights0) == 0
    moved = [name for name in one_weights if "visual" in name]
    assert moved, "no vision-tower weight compared"
    check(f"vlm weights[{method}]", *paired_weights(weights0, one_weights), WEIGHTS)


def test_the_controllers_move_on_the_vlm(vlm_runs):
    """The controller comparisons above are not vacuous: controllers move within the three steps."""
    moving = [method for method in ADAPTIVE_METHODS if len(set(vlm_runs[method][0][0]["controller"])) > 1]
    assert len(moving) >= 3, moving
