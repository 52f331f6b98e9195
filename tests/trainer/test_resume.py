"""Resume: the one suite for checkpoints of every trainer.

A run of N steps straight equals the same run resumed from one of its checkpoints, for every trainer. The runs use
``num_iterations = 2`` (a generation cycle is two optimizer steps) and resume from the checkpoint of step 1, in the
middle of a cycle: the controllers' partial cycle statistics and the buffered generation batch must come back with
them. The completions are sampled from the policy (no fixed rollout), so the resumed run also has to restore the data
order and the random state; the rewards rank the completions inside their group, so every step has advantages and a
loss of its own whichever tokens this CPU's numerics lead the policy to sample. The controller state travels in
``trainer_state.json`` (``stateful_callbacks``), written
before Trainer pushes a checkpoint to the Hub: a pushed checkpoint carries it and resumes exactly; a checkpoint
without it is refused.
"""

import fnmatch
import json
import os
import shutil
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from _support.distributed_run import ADAPTIVE_METHODS, logged
from _support.resume import CHECKPOINT, STEPS, assert_resumed_equals_straight, saved_snapshot, step_values, train
from _support.stand_in_rank import StandInRank

from trl_entropy.core.checkpoint import GENERATION_BATCH_FILE, restore_entropy_control, save_entropy_control
from trl_entropy.core.control import EntropyControlState
from trl_entropy.methods import METHODS
from trl_entropy.methods.clip_cov import CLIP_COV_GENERATOR_FILE


# TRL's own adaptive entropy bonus has state of its own (coefficient, last entropy) in TRL's checkpoint file.
CASES = [(name, {}) for name in sorted(METHODS)] + [
    (
        "entreg",
        {"use_adaptive_entropy": True, "entropy_coef": 0.01, "entropy_target": 0.7, "entropy_coef_delta": 0.005},
    )
]
IDS = [name if not options else f"{name}-adaptive" for name, options in CASES]


@pytest.fixture(scope="module")
def straight_run(warm_toy_policy_path, tmp_path_factory):
    """``straight_run(method, options) -> (trainer, controller values, folder)``: the straight run of a case, with a
    checkpoint at every step, trained once for the module's tests (they only read it)."""
    runs = {}

    def straight(method, options):
        key = (method, tuple(sorted(options.items())))
        if key not in runs:
            folder = tmp_path_factory.mktemp(f"straight_{method}")
            runs[key] = (*train(method, warm_toy_policy_path, str(folder), **options), folder)
        return runs[key]

    return straight


def test_a_methods_own_config_and_the_config_of_every_method_resume_each_other(
    straight_run, warm_toy_policy_path, tmp_path
):
    """A checkpoint written with a method's own config resumes, exactly and without a warning, with EntropyGRPOConfig
    naming the method: both configs name the same method, and the settings recorded are those of the methods
    selected."""
    import warnings

    from trl_entropy import EntropyGRPOConfig, EntropyGRPOTrainer

    straight, straight_values, folder = straight_run("aent", {})
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*differ from the checkpoint's")
        resumed, resumed_values = train(
            "aent",
            warm_toy_policy_path,
            str(tmp_path / "resumed"),
            resume_from=str(folder / f"checkpoint-{CHECKPOINT}"),
            config_class=EntropyGRPOConfig,
            trainer_class=EntropyGRPOTrainer,
            entropy_control=["aent"],
        )
    assert type(resumed.args) is EntropyGRPOConfig
    assert_resumed_equals_straight(straight, straight_values, resumed, resumed_values)


@pytest.mark.parametrize("method, options", CASES, ids=IDS)
def test_resumed_run_equals_straight_run(method, options, straight_run, warm_toy_policy_path, tmp_path):
    straight, straight_values, folder = straight_run(method, options)
    checkpoint = str(folder / f"checkpoint-{CHECKPOINT}")
    resumed, resumed_values = train(
        method, warm_toy_policy_path, str(tmp_path / "resumed"), resume_from=checkpoint, **options
    )
    assert_resumed_equals_straight(straight, straight_values, resumed, resumed_values)

    snapshot = saved_snapshot(checkpoint)
    assert snapshot["trl_step"] == CHECKPOINT  # one micro-batch per step: the cycle's second pass is still to come
    assert os.path.exists(os.path.join(checkpoint, GENERATION_BATCH_FILE.format(process_index=0)))
    if straight.controllers:
        (name,) = straight.controllers
        assert set(snapshot["controllers"][name]) == set(straight.controllers[name].state_dict())
        assert snapshot["cycle_optimizer_steps"] == 1
        # The partial cycle's sums; none for a controller its method moves at every micro-batch (its state is enough).
        assert bool(snapshot["cycle_statistics"]) == (straight.controllers[name].cadence == "cycle")
        assert len(set(straight_values)) > 1, f"{method}'s controller never moved"
    if options.get("use_adaptive_entropy"):
        assert step_values(resumed, "entropy_coef")[STEPS] == pytest.approx(
            step_values(straight, "entropy_coef")[STEPS]
        )
        assert resumed.entropy_coef == pytest.approx(straight.entropy_coef)


# Checkpoints taken after the controllers moved: the end of the first cycle (one update) and inside the second one.
AFTER_UPDATE = (2, 3)


def disable_restore(method, options, patch):
    """The planted bug: the resumed trainer forgets the state its method learned (the controllers' values, Clip-Cov's
    generator, TRL's adaptive coefficient), and keeps everything else."""
    from trl import GRPOTrainer

    from trl_entropy.core.control import ControllerCycle
    from trl_entropy.methods.clip_cov import ClipCovTrainer

    if method == "clip_cov":
        patch.setattr(ClipCovTrainer, "restore_rank_checkpoint_state", lambda self, checkpoint: None)
    elif options.get("use_adaptive_entropy"):
        trl_load = GRPOTrainer._load_optimizer_and_scheduler

        def forget(self, checkpoint):
            coef, last = self.entropy_coef, self._last_world_entropy
            trl_load(self, checkpoint)
            self.entropy_coef, self._last_world_entropy = coef, last

        patch.setattr(GRPOTrainer, "_load_optimizer_and_scheduler", forget)
    else:
        restore = ControllerCycle.restore

        def forget(self, snapshot, keep_sums, device):
            initial = {name: controller.state_dict() for name, controller in self.controllers.items()}
            restore(self, snapshot, keep_sums, device)
            for name, controller in self.controllers.items():
                controller.load_state_dict(initial[name])

        patch.setattr(ControllerCycle, "restore", forget)


STATEFUL_CASES = [
    (method, options)
    for method, options in CASES
    if method in ("aent", "repo_r", "repo_d", "adapo", "clip_cov", "entropic")
] + [case for case in CASES if case[1].get("use_adaptive_entropy")]


@pytest.mark.parametrize(
    "method, options", STATEFUL_CASES, ids=[m if not o else f"{m}-adaptive" for m, o in STATEFUL_CASES]
)
def test_resume_after_a_controller_update_equals_straight_run(
    method, options, straight_run, warm_toy_policy_path, tmp_path
):
    """Resumed from the end of the first cycle and from inside the second, after the state moved off its initial
    value: the next steps equal the straight run's; with the restore switched off (planted bug) they do not."""
    straight, straight_values, straight_folder = straight_run(method, options)
    if straight.controllers:  # the state moved (a value, or a measured target) before the checkpoint
        first, updated = (saved_snapshot(str(straight_folder / f"checkpoint-{s}")) for s in (1, AFTER_UPDATE[0]))
        assert first["controllers"] != updated["controllers"], "no update before the checkpoint"
    for checkpoint in AFTER_UPDATE:
        folder = str(straight_folder / f"checkpoint-{checkpoint}")
        resumed, values = train(
            method, warm_toy_policy_path, str(tmp_path / f"resumed{checkpoint}"), folder, **options
        )
        assert_resumed_equals_straight(straight, straight_values, resumed, values, checkpoint)
    folder = str(straight_folder / f"checkpoint-{AFTER_UPDATE[0]}")
    with pytest.MonkeyPatch.context() as patch:
        disable_restore(method, options, patch)
        forgetful, values = train(method, warm_toy_policy_path, str(tmp_path / "forgetful"), folder, **options)
    with pytest.raises(AssertionError):
        assert_resumed_equals_straight(straight, straight_values, forgetful, values, AFTER_UPDATE[0])


class LocalHub:
    """Stands in for the Hub: ``upload_folder`` copies what the folder holds at push time."""

    def __init__(self, root):
        self.root = root

    def create_repo(self, repo_id, **kwargs):
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def upload_folder(self, repo_id, folder_path, path_in_repo=None, ignore_patterns=(), **kwargs):
        target = os.path.join(self.root, repo_id, path_in_repo or "")
        for directory, _, files in os.walk(folder_path):
            for name in files:
                relative = os.path.relpath(os.path.join(directory, name), folder_path)
                if not any(fnmatch.fnmatch(relative, pattern) for pattern in ignore_patterns or ()):
                    os.makedirs(os.path.dirname(os.path.join(target, relative)), exist_ok=True)
                    shutil.copy(os.path.join(directory, name), os.path.join(target, relative))
        done = Future()
        done.set_result(None)
        return done


# What a pushed checkpoint must hold beyond Trainer's own files, per method: each rank's buffered generation batch (the
# checkpoint is inside a cycle; ERC's carries the rollout entropies) and, for Clip-Cov, each rank's random generator.
PUSHED = {
    "repo_r": [GENERATION_BATCH_FILE.format(process_index=0)],
    "erc": [GENERATION_BATCH_FILE.format(process_index=0)],  # with the rollout entropies it carries
    "clip_cov": [GENERATION_BATCH_FILE.format(process_index=0), CLIP_COV_GENERATOR_FILE.format(process_index=0)],
}


@pytest.fixture(scope="module", params=sorted(PUSHED))
def pushed_run(request, warm_toy_policy_path, tmp_path_factory):
    """A run that pushes every checkpoint to a local stand-in for the Hub (hub_strategy="all_checkpoints")."""
    root = tmp_path_factory.mktemp("pushed")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("transformers.trainer.hf_api", lambda: LocalHub(str(root / "hub")))
        trainer, values = train(
            request.param,
            warm_toy_policy_path,
            str(root / "run"),
            push_to_hub=True,
            hub_model_id="user/pushed",
            hub_strategy="all_checkpoints",
        )
    return request.param, trainer, values, str(root / "hub" / "user" / "pushed" / f"checkpoint-{CHECKPOINT}")


def test_pushed_checkpoint_carries_the_controller_state_and_resumes_exactly(
    pushed_run, warm_toy_policy_path, tmp_path
):
    method, straight, straight_values, pushed = pushed_run
    snapshot = saved_snapshot(pushed)  # what the Hub received
    for name, controller in straight.controllers.items():
        assert set(snapshot["controllers"][name]) == set(controller.state_dict())
    if method == "repo_r":
        assert snapshot["controllers"]["repo"]["entropy_target"] is None  # mid-cycle: not measured yet
        assert snapshot["controllers"]["repo"]["beta"] == straight_values[0]
    for name in PUSHED[method]:
        assert os.path.exists(os.path.join(pushed, name)), name
    resumed, resumed_values = train(method, warm_toy_policy_path, str(tmp_path), resume_from=pushed)
    assert_resumed_equals_straight(straight, straight_values, resumed, resumed_values)


@pytest.mark.parametrize("pushed_run", ["repo_r"], indirect=True)
@pytest.mark.parametrize("missing", ["controller_state", "generation_batch"])
def test_checkpoint_without_what_resuming_needs_is_refused(missing, pushed_run, warm_toy_policy_path, tmp_path):
    _, _, _, pushed = pushed_run
    checkpoint = str(tmp_path / "checkpoint")
    shutil.copytree(pushed, checkpoint)
    if missing == "controller_state":
        path = os.path.join(checkpoint, "trainer_state.json")
        with open(path) as file:
            state = json.load(file)
        del state["stateful_callbacks"][EntropyControlState.__name__]
        with open(path, "w") as file:
            json.dump(state, file)
        match = "holds no entropy-control state"
    else:
        os.remove(os.path.join(checkpoint, GENERATION_BATCH_FILE.format(process_index=0)))
        match = "saved inside a generation cycle"
    with pytest.raises(ValueError, match=match):
        train("repo_r", warm_toy_policy_path, str(tmp_path / "resumed"), resume_from=checkpoint)


# ---------------------------------------------------------------------------------------------------------------------
# Two processes
# ---------------------------------------------------------------------------------------------------------------------


# A method whose controller the generation cycle moves, from its partial sums (the registry's first).
CYCLE_METHOD = next(name for name in ADAPTIVE_METHODS if not METHODS[name].moves_per_micro_batch)
# Each rank's partial-cycle sums [Σ m·statistic, Σ m] when the checkpoint is saved.
RANK_SUMS = ([6.0, 4.0], [3.0, 2.0])


def test_a_checkpoints_partial_cycle_sums_come_back_once_over_the_ranks(tmp_path, monkeypatch, toy_trainer_of):
    """Rank 0 and rank 1 of two, stood in one after the other in one process: the checkpoint holds the world's partial
    sums of the cycle, and after the resume the ranks' sums add up to them once (one rank takes them over), not once
    per rank, which would double the statistic of the cycle's update. The two-process test below runs it for real."""
    trainer = toy_trainer_of(CYCLE_METHOD, num_iterations=2)
    accelerator, cycle = trainer.accelerator, trainer.controller_cycle
    (statistic,) = {controller.statistic for controller in trainer.controllers.values()}
    checkpoint = str(tmp_path / "checkpoint")

    def stand_in(rank: int, others: list[float]) -> None:
        monkeypatch.setattr(trainer, "accelerator", StandInRank(accelerator, rank, 2, torch.tensor([others])))

    for rank, other in ((0, 1), (1, 0)):  # each rank saves its part, after the first of the cycle's two micro-batches
        stand_in(rank, RANK_SUMS[other])
        cycle.statistics, cycle.optimizer_steps = {statistic: torch.tensor(RANK_SUMS[rank])}, 1
        trainer.micro_step, trainer.buffered_generation_batch = 1, {"rank": torch.tensor(rank)}
        save_entropy_control(trainer, checkpoint)
    world = [a + b for a, b in zip(*RANK_SUMS, strict=True)]
    stored = trainer.state.stateful_callbacks[EntropyControlState.__name__]
    assert stored["attributes"]["snapshot"]["cycle_statistics"] == {statistic: world}
    trainer.state.stateful_callbacks = json.loads(json.dumps(trainer.state.stateful_callbacks))  # as the file holds it

    restored = []
    for rank in (0, 1):
        stand_in(rank, [0.0, 0.0])
        cycle.statistics, cycle.optimizer_steps = {}, 0
        trainer.micro_step, trainer.buffered_generation_batch = 0, None
        restore_entropy_control(trainer, checkpoint)
        assert (trainer.micro_step, cycle.optimizer_steps) == (1, 1)
        assert trainer.buffered_generation_batch["rank"].item() == rank  # its own generation batch
        restored.append(cycle.statistics[statistic].tolist())
    assert [a + b for a, b in zip(*restored, strict=True)] == world, restored


def repo_r_rank(model: str, output_dir: str, resume_from: str | None) -> None:
    """One rank of a two-process run: this suite's `train`; rank 0 writes the record into ``output_dir``."""
    trainer, values = train("repo_r", model, output_dir, resume_from=resume_from)
    if trainer.accelerator.is_main_process:
        record = {key: logged(trainer, key) for key in ("loss", "entropy", "repo/entropy_target")}
        with open(os.path.join(output_dir, "record.json"), "w") as file:
            json.dump(dict(record, controller=values), file)


def run_two_processes(two_ranks, model: str, output_dir: Path, resume_from: Path | None = None) -> dict:
    """The record of a two-process run of :func:`repo_r_rank`."""
    two_ranks.run(repo_r_rank, model, str(output_dir), None if resume_from is None else str(resume_from))
    with open(output_dir / "record.json") as file:
        return json.load(file)


# two two-process runs (a launch-tier test, tests/trainer/conftest.py)
def test_two_process_mid_cycle_resume_equals_the_straight_run(two_ranks, warm_toy_policy_path, tmp_path):
    """Each rank saves its own generation batch; the partial cycle sums, reduced at the save, restart on rank 0."""
    straight = run_two_processes(two_ranks, warm_toy_policy_path, tmp_path / "straight")
    checkpoint = tmp_path / "straight" / f"checkpoint-{CHECKPOINT}"
    assert saved_snapshot(str(checkpoint))["num_processes"] == 2
    assert all((checkpoint / GENERATION_BATCH_FILE.format(process_index=rank)).exists() for rank in (0, 1))
    resumed = run_two_processes(two_ranks, warm_toy_policy_path, tmp_path / "resumed", checkpoint)
    assert len(set(straight["loss"][CHECKPOINT:])) == STEPS - CHECKPOINT, "identical losses: the check would be weak"
    for key in ("loss", "entropy", "repo/entropy_target"):  # the target is measured on the resumed cycle's sums
        assert resumed[key][CHECKPOINT:] == pytest.approx(straight[key][CHECKPOINT:], rel=1e-5, abs=1e-7), key
    assert resumed["controller"] == pytest.approx(straight["controller"][CHECKPOINT:], rel=1e-6, abs=1e-12)
