"""Resume with changes: the config given on resume is the run's configuration and the checkpoint gives the learned
state (one warning lists every changed setting); another method's checkpoint is refused unless
``entropy_control_fresh_start``, also between methods with the same controllers; a mid-cycle checkpoint resumed with
another batch layout (or number of processes) regenerates its generation batch with a warning that lists every changed
field; a save a kill interrupted is skipped by ``resume_from_checkpoint=True``, which falls back to the last complete
checkpoint and then equals the straight run; a tied LM head comes back through its tie and is not reported missing.

The runs are :mod:`_support.resume`'s (``num_iterations=2``: a cycle is two optimizer steps, a checkpoint at every
step).
"""

import functools
import logging
import os
import re
import signal
import warnings
from types import SimpleNamespace

import pytest
import safetensors.torch
import torch
import transformers
from _support import resume
from _support.process import run_forked
from _support.resume import STEPS, assert_resumed_equals_straight, saved_snapshot, step_values, train

from trl_entropy.core.checkpoint import (
    GENERATION_BATCH_FILE,
    MISSING_KEYS_LOGGER,
    SAVING_MARKER,
    TiedWeightsNotReportedMissing,
)
from trl_entropy.core.control import DEGENERATE_ENTROPY
from trl_entropy.methods.adapo import ADAPOController
from trl_entropy.methods.aent import AEntController
from trl_entropy.methods.repo import REPOController
from trl_entropy.toy import build_toy_model


TRAINERS = {
    "aent": "AEntTrainer",
    "repo_r": "REPOTrainer",
    "adapo": "ADAPOTrainer",
    "grpo": "EntropyGRPOTrainer",
    "qae": "QAETrainer",
    "clip_cov": "ClipCovTrainer",
    "kl_cov": "KLCovTrainer",
    "entropic": "EntroPICTrainer",
}
# The methods whose straight runs (and checkpoints) the tests resume.
WRITERS = ("aent", "repo_r", "adapo", "grpo", "qae", "entropic")


@pytest.fixture(scope="module")
def straight_runs(warm_toy_policy_path, tmp_path_factory):
    """``{method: (trainer, controller values, output dir)}``: a straight run of STEPS steps, a checkpoint each."""
    runs = {}
    for method in WRITERS:
        output_dir = str(tmp_path_factory.mktemp(f"straight_{method}"))
        trainer, values = train(method, warm_toy_policy_path, output_dir)
        runs[method] = trainer, values, output_dir
    return runs


def changed_settings_warning(record) -> str:
    (message,) = [str(w.message) for w in record if "settings that differ" in str(w.message)]
    return message


# ---------------------------------------------------------------------------------------------------------------------
# Changed settings: the new value is used, the warning lists it; the learned state comes from the checkpoint
# ---------------------------------------------------------------------------------------------------------------------

CHANGED = [
    ("repo_r", {"repo_entropy_target": 0.3}, "repo", "beta", "repo_entropy_target: None → 0.3"),
    ("adapo", {"adapo_entropy_target": 0.9}, "adapo", "epsilon_high", "adapo_entropy_target: None → 0.9"),
]


@pytest.mark.parametrize("method, options, name, key, listed", CHANGED, ids=[c[0] for c in CHANGED])
def test_resume_with_a_new_target_uses_it_and_keeps_the_learned_value(
    method, options, name, key, listed, straight_runs, warm_toy_policy_path, tmp_path
):
    _, _, straight_dir = straight_runs[method]
    checkpoint = os.path.join(straight_dir, "checkpoint-2")  # the target was measured at step 2
    stored, (target,) = saved_snapshot(checkpoint)["controllers"][name], options.values()
    assert stored["entropy_target"] is not None and stored["entropy_target"] != target
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        resumed, values = train(method, warm_toy_policy_path, str(tmp_path), checkpoint, max_steps=3, **options)
    assert listed in changed_settings_warning(record)
    controller = resumed.controllers[name]
    assert controller.entropy_target == target  # the config's target
    assert values == [stored[key]]  # step 3 ends no cycle: the learned value, from the checkpoint


def test_resume_with_aent_switched_to_a_fixed_coefficient_uses_it(straight_runs, warm_toy_policy_path, tmp_path):
    _, straight_values, straight_dir = straight_runs["aent"]
    checkpoint = os.path.join(straight_dir, "checkpoint-2")
    assert saved_snapshot(checkpoint)["controllers"]["aent"]["coef"] == straight_values[1] != 5e-4
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        resumed, values = train(
            "aent", warm_toy_policy_path, str(tmp_path), checkpoint, aent_adaptive=False, aent_coef_init=5e-4
        )
    message = changed_settings_warning(record)
    assert "aent_adaptive: True → False" in message and "aent_coef_init: 0.0002 → 0.0005" in message
    assert values == [5e-4, 5e-4]  # the fixed value applies from the first resumed step on


def test_resume_with_new_entropic_gains_uses_them_and_keeps_alpha_and_the_integral(
    straight_runs, warm_toy_policy_path, tmp_path
):
    """EntroPIC's α and integral come from the checkpoint; the new target and gains move them from the next
    micro-batch on (a cycle is two micro-batches here, w = 1/2)."""
    _, _, straight_dir = straight_runs["entropic"]
    checkpoint = os.path.join(straight_dir, "checkpoint-2")
    stored = saved_snapshot(checkpoint)["controllers"]["entropic"]
    assert stored["integral"] != 0.0
    options = {"entropic_target": 0.2, "entropic_kp": 0.5, "entropic_ki": 0.05}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        resumed, values = train("entropic", warm_toy_policy_path, str(tmp_path), checkpoint, max_steps=3, **options)
    message = changed_settings_warning(record)
    assert all(f"{name}: " in message for name in options), message
    error = step_values(resumed, "entropy")[3] - 0.2  # step 3: one micro-batch, its world-mean entropy
    alpha = min(max(0.5 * error + 0.05 * stored["integral"], -1.0), 1.0)
    assert values == [pytest.approx(alpha, rel=1e-5)]
    assert resumed.controllers["entropic"].integral == pytest.approx(stored["integral"] + error / 2, rel=1e-5)


def test_resume_with_the_same_settings_does_not_warn(straight_runs, warm_toy_policy_path, tmp_path):
    _, _, straight_dir = straight_runs["repo_r"]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        train("repo_r", warm_toy_policy_path, str(tmp_path), os.path.join(straight_dir, "checkpoint-2"), max_steps=3)
    assert not [w for w in record if "settings that differ" in str(w.message)]


# ---------------------------------------------------------------------------------------------------------------------
# Another method's checkpoint: refused, naming both; entropy_control_fresh_start starts the controllers fresh
# ---------------------------------------------------------------------------------------------------------------------

# (written by, resumed by, whether both have the same controllers): where they are the same (none), only the method
# that wrote the checkpoint tells it apart.
CROSS = [
    ("aent", "kl_cov", False),
    ("repo_r", "clip_cov", False),
    ("adapo", "grpo", False),
    ("grpo", "aent", False),  # the opposite direction: no controller state to take over
    ("grpo", "clip_cov", True),
    ("grpo", "kl_cov", True),
    ("grpo", "qae", True),
    ("qae", "grpo", True),
    ("qae", "clip_cov", True),
    ("entropic", "aent", False),  # a controller the method moves itself is refused and started fresh as any other
]


@pytest.mark.parametrize("written_by, method, same_controllers", CROSS, ids=[f"{a}->{b}" for a, b, _ in CROSS])
def test_cross_method_resume_is_refused_unless_fresh_start(
    written_by, method, same_controllers, straight_runs, warm_toy_policy_path, tmp_path
):
    straight, _, straight_dir = straight_runs[written_by]
    checkpoint = os.path.join(straight_dir, "checkpoint-2")
    with pytest.raises(ValueError, match="entropy_control_fresh_start") as error:
        train(method, warm_toy_policy_path, str(tmp_path / "refused"), checkpoint, max_steps=3)
    assert TRAINERS[written_by] in str(error.value) and TRAINERS[method] in str(error.value)
    with pytest.warns(UserWarning, match="starts fresh"):
        resumed, values = train(
            method,
            warm_toy_policy_path,
            str(tmp_path / "fresh"),
            checkpoint,
            max_steps=3,
            entropy_control_fresh_start=True,
        )
    assert (set(saved_snapshot(checkpoint)["controllers"]) == set(resumed.controllers)) == same_controllers
    assert resumed.state.global_step == 3 and len(values) == 1
    # A new cycle started at the resume and step 3 ends none: the controllers still hold the config's initial state.
    initial = {c.name: c.state_dict() for part in resumed.parts for c in part.controllers()}
    assert {name: c.state_dict() for name, c in resumed.controllers.items()} == initial


# ---------------------------------------------------------------------------------------------------------------------
# Mid-cycle checkpoint, another layout: the batch is regenerated, with a warning
# ---------------------------------------------------------------------------------------------------------------------

# Options given on resume -> every layout field that changes, (checkpoint's value, new value). TRL derives
# steps_per_generation from gradient_accumulation_steps unless it is given. The number of processes:
# test_two_process_checkpoint_resumed_by_one_process_regenerates.
LAYOUTS = {
    "steps_per_generation": ({"steps_per_generation": 2}, {"steps_per_generation": (1, 2)}),
    "gradient_accumulation_steps": (
        {"gradient_accumulation_steps": 2},
        {"gradient_accumulation_steps": (1, 2), "steps_per_generation": (1, 2)},
    ),
    "per_device_train_batch_size": ({"per_device_train_batch_size": 8}, {"per_device_train_batch_size": (16, 8)}),
    "num_iterations": ({"num_iterations": 4}, {"num_iterations": (2, 4)}),
    "two_fields": (
        {"per_device_train_batch_size": 8, "num_iterations": 4},
        {"per_device_train_batch_size": (16, 8), "num_iterations": (2, 4)},
    ),
}


def layout_changes(record) -> set[str]:
    """The ``name: old → new`` items of the one layout warning in ``record``."""
    (message,) = [str(w.message) for w in record if "layout changed" in str(w.message)]
    assert "regenerated" in message, message
    return set(re.search(r"layout changed \((.*?)\)", message).group(1).split(", "))


def train_with(options, monkeypatch, *arguments, **keywords):
    """:func:`_support.resume.train` with ``options`` applied over its fixed ones (``num_iterations`` among them)."""
    build = resume.make_trainer
    monkeypatch.setattr(resume, "make_trainer", lambda *a, **k: build(*a, **{**k, **options}))
    return train(*arguments, **keywords)


@pytest.mark.parametrize("case", sorted(LAYOUTS))
def test_mid_cycle_resume_with_another_layout_trains_and_warns(
    case, straight_runs, warm_toy_policy_path, tmp_path, monkeypatch
):
    options, changes = LAYOUTS[case]
    _, straight_values, straight_dir = straight_runs["repo_r"]
    checkpoint = os.path.join(straight_dir, "checkpoint-1")  # inside the first cycle, a buffered batch saved
    assert os.path.exists(os.path.join(checkpoint, GENERATION_BATCH_FILE.format(process_index=0)))
    stored = saved_snapshot(checkpoint)["layout"]
    assert {name: stored[name] for name in changes} == {name: old for name, (old, _) in changes.items()}
    with pytest.warns(UserWarning, match="layout changed") as record:
        resumed, values = train_with(
            options, monkeypatch, "repo_r", warm_toy_policy_path, str(tmp_path), checkpoint, 2
        )
    listed = {f"{name}: {old} → {new}" for name, (old, new) in changes.items()}
    assert layout_changes(record) == listed  # every changed field, no other
    settings = changed_settings_warning(record)  # the config's fields among them, in the settings warning too
    assert all(item in settings for item in listed), settings
    assert resumed.state.global_step == 2 and values == [straight_values[0]]  # β from the checkpoint, trained on


def one_step_rank(model: str, output_dir: str) -> None:
    """One rank of a two-process run of one step: checkpoint-1, inside the first cycle."""
    train("repo_r", model, output_dir, max_steps=1)


def test_two_process_checkpoint_resumed_by_one_process_regenerates(two_ranks, warm_toy_policy_path, tmp_path):
    """Each rank buffered its own half of the generation batch: one process cannot take them over, so the batch is
    regenerated, with the layout warning naming the number of processes."""
    two_ranks.run(one_step_rank, warm_toy_policy_path, str(tmp_path / "two"))
    checkpoint = str(tmp_path / "two" / "checkpoint-1")
    snapshot = saved_snapshot(checkpoint)
    old = snapshot["layout"]
    assert snapshot["num_processes"] == 2
    assert snapshot["trl_step"] % (old["steps_per_generation"] * old["num_iterations"]) != 0  # inside a cycle
    assert all(os.path.exists(os.path.join(checkpoint, GENERATION_BATCH_FILE.format(process_index=r))) for r in (0, 1))
    with pytest.warns(UserWarning, match="layout changed") as record:
        resumed, values = train("repo_r", warm_toy_policy_path, str(tmp_path / "one"), checkpoint, max_steps=2)
    assert layout_changes(record) == {"num_processes: 2 → 1"}
    assert resumed.accelerator.num_processes == 1 and resumed.state.global_step == 2
    assert 2 in step_values(resumed, "reward")  # step 2 generated (in the two-process cycle it would not have)
    assert values == [snapshot["controllers"]["repo"]["beta"]]  # the checkpoint's β; the new cycle has not ended


# ---------------------------------------------------------------------------------------------------------------------
# Interrupted saves: skipped by resume_from_checkpoint=True, which resumes from the last complete checkpoint
# ---------------------------------------------------------------------------------------------------------------------


class Interrupted(BaseException):
    """Stands in for a kill: nothing after the raise point runs (BaseException: no handler catches it)."""


def interrupted_inside_third_save(function, output_dir):
    """``function``, raising :class:`Interrupted` once the save of checkpoint-3 has begun."""

    def interrupted(*args, **kwargs):
        if os.path.isdir(os.path.join(output_dir, "checkpoint-3")):
            raise Interrupted
        return function(*args, **kwargs)

    return interrupted


# Points inside the save of checkpoint-3: after our files, before the model; after trainer_state.json, before the
# save ends (Trainer's checkpoint rotation, its last step).
POINTS = {
    "before_the_model": (transformers.Trainer, "save_model"),
    "after_the_trainer_state": (transformers.trainer, "rotate_checkpoints"),
}


def train_killed_inside_the_optimizer_write(path: str, output_dir: str) -> None:
    """Train REPO-R and, when the save of checkpoint-3 writes optimizer.pt, write half of it and SIGKILL this
    process."""
    save = torch.save

    def killing_save(obj, f, *args, **kwargs):
        if isinstance(f, str) and f.endswith(os.path.join("checkpoint-3", "optimizer.pt")):
            with open(f, "wb") as file:
                file.write(b"half an optimizer")
                file.flush()
                os.fsync(file.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        return save(obj, f, *args, **kwargs)

    torch.save = killing_save  # Trainer writes optimizer.pt through torch.save
    train("repo_r", path, output_dir)


def check_resume_from_the_last_complete(straight_runs, path, output_dir):
    straight, straight_values, _ = straight_runs["repo_r"]
    interrupted = os.path.join(output_dir, "checkpoint-3")
    assert os.path.exists(os.path.join(interrupted, SAVING_MARKER))
    with pytest.warns(UserWarning, match="skipping the incomplete checkpoint .*checkpoint-3"):
        resumed, values = train("repo_r", path, output_dir, True)
    assert_resumed_equals_straight(straight, straight_values, resumed, values, checkpoint=2)


@pytest.mark.parametrize("point", sorted(POINTS))
def test_interrupted_save_is_skipped_on_resume(point, straight_runs, warm_toy_policy_path, tmp_path):
    target, attribute = POINTS[point]
    output_dir = str(tmp_path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(target, attribute, interrupted_inside_third_save(getattr(target, attribute), output_dir))
        with pytest.raises(Interrupted):
            train("repo_r", warm_toy_policy_path, output_dir)
    check_resume_from_the_last_complete(straight_runs, warm_toy_policy_path, output_dir)


def test_kill_inside_the_optimizer_write_is_skipped_on_resume(straight_runs, warm_toy_policy_path, tmp_path):
    output_dir = str(tmp_path / "run")
    status, printed = run_forked(train_killed_inside_the_optimizer_write, warm_toy_policy_path, output_dir)
    assert status == -signal.SIGKILL, printed[-3000:]
    assert open(os.path.join(output_dir, "checkpoint-3", "optimizer.pt"), "rb").read() == b"half an optimizer"
    check_resume_from_the_last_complete(straight_runs, warm_toy_policy_path, output_dir)


# ---------------------------------------------------------------------------------------------------------------------
# A tied LM head: not saved on its own, restored through its tie, and not reported missing on resume
# ---------------------------------------------------------------------------------------------------------------------


class RecordedLog(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_a_tied_head_is_restored_through_its_tie_and_not_reported_missing(
    straight_runs, warm_toy_policy_path, tmp_path, monkeypatch
):
    straight, _, straight_dir = straight_runs["repo_r"]
    checkpoint = os.path.join(straight_dir, "checkpoint-2")
    stored = safetensors.torch.load_file(os.path.join(checkpoint, "model.safetensors"))
    assert "lm_head.weight" not in stored  # the tied head is stored once, as the input embedding
    heads = []
    load = transformers.Trainer._load_from_checkpoint

    @functools.wraps(load)  # the drift guard checks the parameters of the method it finds
    def recording_load(self, *arguments, **keywords):
        load(self, *arguments, **keywords)
        heads.append(self.model.get_output_embeddings().weight.detach().clone())

    monkeypatch.setattr(transformers.Trainer, "_load_from_checkpoint", recording_load)
    log = RecordedLog()
    logging.getLogger(MISSING_KEYS_LOGGER).addHandler(log)
    try:
        resumed, _ = train("repo_r", warm_toy_policy_path, str(tmp_path), checkpoint)
    finally:
        logging.getLogger(MISSING_KEYS_LOGGER).removeHandler(log)
    assert not [message for message in log.messages if "missing keys" in message], log.messages
    (head,) = heads
    assert torch.equal(head, stored["model.embed_tokens.weight"])  # the checkpoint's head, through the embedding
    model = resumed.model
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # still tied after training
    torch.testing.assert_close(  # and trained as in the straight run
        model.get_output_embeddings().weight, straight.model.get_output_embeddings().weight, rtol=1e-5, atol=1e-6
    )


REPORT = "There were missing keys in the checkpoint model loaded: {}."
# (model tied?, message logged by transformers.trainer, whether it still shows)
MISSING_KEY_REPORTS = [
    (True, REPORT.format(["lm_head.weight"]), False),
    (True, REPORT.format(["model.embed_tokens.weight"]), False),  # stored under the head's name instead
    (True, REPORT.format(["lm_head.weight", "model.embed_tokens.weight"]), True),  # nothing to restore them from
    (True, REPORT.format(["lm_head.weight", "model.norm.weight"]), True),
    (True, REPORT.format(["model.norm.weight"]), True),
    (False, REPORT.format(["lm_head.weight"]), True),  # an untied head really is missing
    (True, "There were unexpected keys in the checkpoint model loaded: ['lm_head.weight'].", True),
]


@pytest.mark.parametrize("tied, message, shows", MISSING_KEY_REPORTS)
def test_only_tied_weights_are_left_out_of_the_missing_keys_report(tied, message, shows, toy_tokenizer):
    model = build_toy_model(toy_tokenizer, tie_word_embeddings=tied)
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    record = logging.LogRecord(MISSING_KEYS_LOGGER, logging.WARNING, __file__, 0, message, None, None)
    assert TiedWeightsNotReportedMissing(SimpleNamespace(model=model)).filter(record) == shows


# ---------------------------------------------------------------------------------------------------------------------
# A degenerate measured target warns
# ---------------------------------------------------------------------------------------------------------------------


CONTROLLERS = {
    "repo": lambda: REPOController(0.04, 1e-4, 0.05),
    "adapo": lambda: ADAPOController(0.28, 0.01, 0.2, 0.4),
}


@pytest.mark.parametrize("name", sorted(CONTROLLERS))
def test_degenerate_measured_target_warns(name):
    controller = CONTROLLERS[name]()
    with pytest.warns(UserWarning, match="practically zero"):
        controller.update(1.7e-13, 2)  # every completion EOS: the first cycle's entropy
    assert controller.entropy_target == 1.7e-13 < DEGENERATE_ENTROPY
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CONTROLLERS[name]().update(0.5, 2)  # a real target: no warning


assert STEPS == 4  # the checkpoints above: 1 (inside the first cycle), 2 (its end), 3 (inside the second)


@pytest.mark.parametrize(
    ("controller", "state", "expected"),
    [
        (REPOController(0.0, 1e-4, 0.01), {"beta": 0.04, "entropy_target": 0.5}, 0.01),
        (REPOController(0.0, 1e-4, 0.01), {"beta": -0.04, "entropy_target": 0.5}, -0.01),
        (REPOController(0.0, 1e-4, 0.05), {"beta": 0.04, "entropy_target": 0.5}, 0.04),
        (ADAPOController(0.28, 0.01, 0.1, 0.3), {"epsilon_high": 0.45, "entropy_target": 0.5}, 0.3),
        (ADAPOController(0.28, 0.01, 0.2, 0.5), {"epsilon_high": 0.15, "entropy_target": 0.5}, 0.2),
        (AEntController(1e-3, 0.05, 0.23, 1e-3, 1e-5, 2e-3), {"coef": 3e-3}, 2e-3),
        (AEntController(1e-3, 0.05, 0.23, 1e-3, 1e-4, 3e-3), {"coef": 1e-5}, 1e-4),
    ],
)
def test_a_learned_value_outside_the_new_range_is_brought_into_it(controller, state, expected):
    """Resumed with a narrower range than the checkpoint's run had, the learned value is clipped to the new range."""
    controller.load_state_dict(state)
    assert controller.value == expected
