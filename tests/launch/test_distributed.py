"""Two processes (``accelerate launch``, gloo on the CPU) against one process with the same global batch: plain DDP,
DeepSpeed ZeRO-3 and FSDP2.

Completions come from ``distributed_run.deterministic_rollout`` (a fixed function of the prompt), so every run scores
the same completions; the rest is the trainers' own: scoring, advantages, loss, the gradient reduction, the controller
statistic reduced across ranks, and the controller update. Two ranks with 4 completions each must reproduce one process
with 8: the loss, the controller value after every step, and the full weights after three optimizer steps. Every rank
must hold the same controller value after every step.

* DDP: each adaptive trainer (AEnt, REPO-R, REPO-D, ADAPO), the methods that gather every rank's rewards, those
  that read the rollout policy's entropy, and two methods combined, each with a controller (``COMBINED``).
* ZeRO-3 (``tests/_support/zero3_cpu.json``: every parameter partitioned, ``stage3_param_persistence_threshold: 0``)
and FSDP2
  (``fully_shard`` on each decoder layer, on the LM head as its own unit, on the root; applied by the run script, since
  accelerate on the CPU turns an FSDP config into DDP), each with a tied and an untied LM head: AEnt (a controller) and
  the base with control off, which must also match ``trl.GRPOTrainer`` on one process. The records say what ran
  (distributed type, ZeRO stage, which parameters are sharded on each rank, how the LM-head weight is held when the
  entropy head reads it); the tests check that first.
"""

import os
from pathlib import Path

import pytest
from _support import distributed_run
from _support.distributed_run import (
    ADAPTIVE_METHODS,
    ROLLOUT_ENTROPY_METHODS,
    TRL_REFERENCE,
    beside_two_processes,
    check_controllers,
    controller_steps,
    finish,
    launch_two_processes,
    paired_weights,
    read_record,
    run,
    save_untied_copy,
)
from _support.methods import first_combinable_pair
from _support.rounding import TWO_PROCESS_CONTROLLERS as CONTROLLERS
from _support.rounding import TWO_PROCESS_ENTROPY as ENTROPY
from _support.rounding import TWO_PROCESS_LOSS as LOSS
from _support.rounding import TWO_PROCESS_WEIGHTS, Bound, check

from trl_entropy.methods import METHODS


SUPPORT = Path(__file__).resolve().parents[1] / "_support"
STEPS = 3
SHARDED_METHODS = ("aent", "grpo")  # a controller; control off (compared with trl.GRPOTrainer too)
HEADS = ("tied", "untied")
WEIGHTS = TWO_PROCESS_WEIGHTS["toy"]
# A gate's kept fraction: 0 on every path (a fraction of whole tokens); no planted bug here changes the gate.
METHOD_METRICS = Bound(rel=1e-5, abs=1e-7)


def max_weight_difference(first: dict, second: dict) -> float:
    assert first.keys() == second.keys()
    return max((first[name] - second[name]).abs().max().item() for name in first)


def script_options(folder: Path, *options: str) -> list[str]:
    """``distributed_run.py``'s options for a two-process run writing into ``folder``."""
    return ["--out", str(folder), "--per-device-batch-size", "4", "--steps", str(STEPS), *options]


# ---------------------------------------------------------------------------------------------------------------------
# DDP: every adaptive trainer
# ---------------------------------------------------------------------------------------------------------------------


# The adaptive trainers, the methods whose advantages need every rank's rewards (a group baseline taken over the
# rewards gathered from all ranks, then each rank keeps its own rows), and those that read the rollout policy's entropy
# (each rank carries its own rows of it through TRL's shuffle and split; they run with two updates per rollout). A
# method that normalises over the micro-batch it is given (STEER, as its authors: per micro-batch and per rank) cannot
# equal one process by its definition, and has no state for the ranks to share.


# Two adaptive methods combined, each moved by its own controller from the all-reduced entropy.
COMBINED = first_combinable_pair(ADAPTIVE_METHODS)
TWO_PROCESS_METHODS = (
    *ADAPTIVE_METHODS,
    *(name for name, spec in METHODS.items() if spec.needs_all_ranks_rewards),
    *(name for name in ROLLOUT_ENTROPY_METHODS if not METHODS[name].normalises_per_micro_batch),
    COMBINED,
)


@pytest.fixture(scope="module")
def runs(two_ranks, warm_toy_policy_path, tmp_path_factory):
    """``{method: ((one_process_record, weights), [(rank0_record, weights), (rank1_record, weights)])}``."""
    two = tmp_path_factory.mktemp("two_processes")
    job = two_ranks.submit(
        distributed_run.main,
        script_options(two, "--model", warm_toy_policy_path, "--methods", ",".join(TWO_PROCESS_METHODS)),
    )
    one = tmp_path_factory.mktemp("one_process")
    return beside_two_processes(
        job,
        two,
        one,
        TWO_PROCESS_METHODS,
        lambda method: run(method, warm_toy_policy_path, str(one), per_device_batch_size=8, steps=STEPS),
    )


@pytest.mark.parametrize("method", [*ADAPTIVE_METHODS, COMBINED])
def test_every_rank_holds_the_same_controller_value(runs, method):
    _, ranks = runs[method]
    (rank0, weights0), (rank1, weights1) = ranks
    assert [rank0["num_processes"], rank1["num_processes"]] == [2, 2]
    assert rank0["sharding"]["distributed_type"] == "MULTI_CPU" and rank0["sharding"]["sharded_parameters"] == []
    assert len(rank0["controller"]) == STEPS
    assert rank0["controller"] == rank1["controller"]  # bit for bit: both update from the same all-reduced statistic
    for moved in zip(*controller_steps(rank0), strict=True):  # each controller
        assert len(set(moved)) > 1, f"a controller of {method} never moved: the check would be vacuous"
    assert rank0["loss"] == rank1["loss"] and rank0["entropy"] == rank1["entropy"]
    assert max_weight_difference(weights0, weights1) == 0  # DDP keeps the replicas identical


@pytest.mark.parametrize("method", TWO_PROCESS_METHODS)
def test_two_processes_reproduce_one_process(runs, method):
    (one, one_weights), ((rank0, weights0), _) = runs[method]
    assert one["num_processes"] == 1
    assert rank0["reward"] == one["reward"]  # the same completions and rewards
    if method in (*ADAPTIVE_METHODS, COMBINED):  # one update per step: a cycle, or the step's one micro-batch
        check_controllers("ddp", method, rank0, one, CONTROLLERS)
    check(f"ddp entropy[{method}]", rank0["entropy"], one["entropy"], ENTROPY)
    check(f"ddp loss[{method}]", rank0["loss"], one["loss"], LOSS)
    check(f"ddp weights[{method}]", *paired_weights(weights0, one_weights), WEIGHTS)
    if method in ROLLOUT_ENTROPY_METHODS:  # each rank's rows of the rollout entropy gate the same tokens
        for key, values in one["method_metrics"].items():
            check(f"ddp {key}[{method}]", rank0["method_metrics"][key], values, METHOD_METRICS)
            assert len(set(values)) > 1, f"{key} never moved: the check would be weak"


# ---------------------------------------------------------------------------------------------------------------------
# DeepSpeed ZeRO-3 and FSDP2, tied and untied LM head
# ---------------------------------------------------------------------------------------------------------------------

SHARDINGS = ("zero3", "fsdp2")


@pytest.fixture(scope="module")
def policies(warm_toy_policy_path, tmp_path_factory):
    """``{"tied": path, "untied": path}``: the warm toy policy (tied embeddings) and a copy with its head untied."""
    folder = tmp_path_factory.mktemp("policies")
    tied, untied = folder / "tied", folder / "untied"
    os.symlink(warm_toy_policy_path, tied)
    save_untied_copy(warm_toy_policy_path, str(untied))
    return {"tied": str(tied), "untied": str(untied)}


@pytest.fixture(scope="module")
def sharded_runs(two_ranks, policies, tmp_path_factory):
    """``{(sharding, head, method): [(rank0_record, weights), (rank1_record, weights)]}`` and, under the key
    ``(None, head, method)``, the one-process run ``(record, weights)``, for AEnt, the base and trl.GRPOTrainer."""
    models = ["--model", policies["tied"], policies["untied"], "--methods", ",".join(SHARDED_METHODS)]
    folders = {sharding: tmp_path_factory.mktemp(sharding) for sharding in SHARDINGS}
    results = {}
    # DeepSpeed needs a launch of its own (accelerate's DeepSpeed launcher); FSDP2 runs on the test process's two
    # ranks, after it (one two-process run at a time on two cores). The one-process runs go on here meanwhile.
    launched = launch_two_processes(
        SUPPORT / "distributed_run.py",
        script_options(folders["zero3"], *models),
        folders["zero3"],
        ["--use_deepspeed", "--deepspeed_config_file", str(SUPPORT / "zero3_cpu.json")],
        DS_ACCELERATOR="cpu",
    )
    try:
        one = tmp_path_factory.mktemp("one_process_sharded")
        for head in HEADS:
            for method in (*SHARDED_METHODS, TRL_REFERENCE):
                run(method, policies[head], str(one / head), per_device_batch_size=8, steps=STEPS)
                results[None, head, method] = read_record(one / head, method)
    finally:
        finish(launched, folders["zero3"])
    two_ranks.run(distributed_run.main, script_options(folders["fsdp2"], *models, "--fsdp2"))
    for sharding in SHARDINGS:
        for head in HEADS:
            for method in SHARDED_METHODS:
                results[sharding, head, method] = [
                    read_record(folders[sharding] / head, method, rank) for rank in (0, 1)
                ]
    return results


# How the LM-head weight is held when the entropy head reads it at the first step (the `head_weight_reads` record).
# ZeRO-3: a released partition, tied or not (the embedding's module releases the weight after its forward): nothing
# upstream has gathered it for the head. FSDP2 untied: a DTensor shard (the head's own unit is never called); tied: the
# unit of the embedding and the head has gathered it for the embedding, so it is a plain tensor.
FIRST_HEAD_READ = {
    ("zero3", "untied"): {"kind": "zero3", "status": "NOT_AVAILABLE", "local_numel": 0},
    ("zero3", "tied"): {"kind": "zero3", "status": "NOT_AVAILABLE", "local_numel": 0},
    ("fsdp2", "untied"): {"kind": "dtensor", "placements": ["S(0)"], "mesh_size": 2},
    ("fsdp2", "tied"): {"kind": "tensor"},
}


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("sharding", SHARDINGS)
def test_sharded_runs_ran_sharded(sharded_runs, sharding, head):
    """What ran, read inside the run: every parameter of the model is sharded over the two ranks, under DeepSpeed
    ZeRO-3 or as FSDP2 DTensors, the head tied or untied as asked."""
    for method in SHARDED_METHODS:
        for rank, (record, _) in enumerate(sharded_runs[sharding, head, method]):
            sharding_info = record["sharding"]
            assert (record["num_processes"], record["rank"]) == (2, rank)
            assert sharding_info["tied"] is (head == "tied")
            assert sharding_info["parameters"] == (20 if head == "tied" else 21)
            assert len(sharding_info["sharded_parameters"]) == sharding_info["parameters"]
            lm_head = sharding_info["lm_head"]
            if sharding == "zero3":
                assert (sharding_info["distributed_type"], sharding_info["zero_stage"]) == ("DEEPSPEED", 3)
                assert (lm_head["kind"], lm_head["local_numel"]) == ("zero3", 0)
                assert lm_head["partition_numel"] == lm_head["numel"] // 2
            else:
                assert sharding_info["distributed_type"] == "MULTI_CPU"  # accelerate's view; FSDP2 applied by us
                assert (lm_head["kind"], lm_head["placements"], lm_head["mesh_size"]) == ("dtensor", ["S(0)"], 2)
                assert lm_head["local_numel"] < lm_head["numel"]
            reads = record["head_weight_reads"]
            assert len(reads) == STEPS  # one scoring forward per step (on-policy)
            expected = FIRST_HEAD_READ[sharding, head]
            assert {key: reads[0][key] for key in expected} == expected


@pytest.mark.parametrize("method", SHARDED_METHODS)
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("sharding", SHARDINGS)
def test_sharded_two_processes_reproduce_one_process(sharded_runs, sharding, head, method):
    (rank0, weights0), (rank1, weights1) = sharded_runs[sharding, head, method]
    one, one_weights = sharded_runs[None, head, method]
    assert one["num_processes"] == 1 and one["sharding"]["sharded_parameters"] == []
    # Both ranks hold the same controller values, losses and (gathered) weights.
    assert rank0["controller"] == rank1["controller"] and rank0["loss"] == rank1["loss"]
    assert max_weight_difference(weights0, weights1) == 0
    assert rank0["reward"] == one["reward"]  # the same completions and rewards
    if method == "aent":
        assert len(set(rank0["controller"])) == STEPS, "the controller must move every step for the check to bite"
        check_controllers(sharding, method, rank0, one, CONTROLLERS)
    else:
        assert rank0["controller"] == one["controller"] == [None] * STEPS
    check(f"{sharding} loss[{method}]", rank0["loss"], one["loss"], LOSS)
    check(f"{sharding} weights[{method}]", *paired_weights(weights0, one_weights), WEIGHTS)


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("sharding", SHARDINGS)
def test_sharded_base_matches_trl(sharded_runs, sharding, head):
    """The base with control off on two sharded ranks against ``trl.GRPOTrainer`` on one process."""
    ((ours, our_weights), _) = sharded_runs[sharding, head, "grpo"]
    trl_record, trl_weights = sharded_runs[None, head, TRL_REFERENCE]
    assert ours["reward"] == trl_record["reward"]
    check(f"{sharding} loss against trl", ours["loss"], trl_record["loss"], LOSS)
    check(f"{sharding} weights against trl", *paired_weights(our_weights, trl_weights), WEIGHTS)
