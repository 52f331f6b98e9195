"""Gradient accumulation and generation cycles.

Controllers update once per generation cycle (docs/adding_a_method.md, "Controllers"): the last tests train with
``num_iterations = 2``, with ``steps_per_generation = 2 × gradient_accumulation_steps`` and with an optimizer step that
spans two cycles, and check when the controllers move and what statistic they see.

Gradient accumulation 2 with half the micro-batch reproduces accumulation 1 (loss, gradients, controller values), on
two levels:

* the loss step, driven directly: one micro-batch of 8 completions against the same 8 split in two micro-batches of 4
  over one accumulation window, for every method and loss type, over two optimizer steps (so the second step's loss
  uses the controller value the first window produced);
* the training loop: ``per_device_train_batch_size=8`` against 4 with ``gradient_accumulation_steps=2``, three
  optimizer steps of each adaptive trainer whose controllers move once per cycle, and of each method that reads the
  rollout entropy, on the same completions.

A controller its method moves at every micro-batch (EntroPIC's) sees each half alone, by its definition; for it, the
same micro-batches give the same states whether they share an accumulation window or not.

A token mean taken per micro-batch (``bnpo``, AEnt's bonus, TRL's entropy bonus) equals the full batch's token mean
only when the two halves hold as many tokens; that is how TRL defines them, so the batches here split into halves of
equal token counts. The controllers' statistic is a window sum and needs no such care (the last test).
"""

import pytest
import torch
from _support.distributed_run import (
    ADAPTIVE_METHODS,
    ROLLOUT_ENTROPY_METHODS,
    ControllerRecorder,
    logged,
    make_rollout,
    make_trainer,
)
from _support.grpo import make_grpo_batch, naive_entropy, toy_config, toy_trainer
from _support.rounding import Bound, check, check_per_update

from trl_entropy.core.batch import OLD_ENTROPY_KEY
from trl_entropy.methods import METHODS, get_method


# Options that make each method's loss depend on everything it can: a controller that moves on the first update, the
# Clip-Cov/KL-Cov selections deterministic (all candidates chosen: a random or top-k pick per micro-batch cannot match
# a pick over the whole batch, by the methods' definition).
METHOD_OPTIONS = {
    "grpo": {"beta": 0.05},
    "entreg": {"entropy_coef": 0.01},
    "entreg-adaptive": {"use_adaptive_entropy": True, "entropy_coef": 0.01, "entropy_target": 5.0},
    "aent": {"aent_entropy_low": 5.0, "aent_entropy_high": 6.0, "aent_coef_lr": 0.01, "aent_coef_max": 1.0},
    # Every token whose clip is inactive is detached; beta > 0 leaves the KL term's gradient.
    "clip_cov": {"clip_cov_ratio": 1.0, "clip_cov_lb": -1e9, "clip_cov_ub": 1e9, "beta": 0.05},
    "kl_cov": {"kl_cov_ratio": 1.0},
    "repo_r": {"repo_beta": -0.04, "repo_entropy_target": 5.0},  # pushing the wrong way: halved each cycle
    "repo_d": {"repo_beta": 0.01, "repo_entropy_target": 5.0},
    "adapo": {"adapo_entropy_target": 5.0},
    # The methods that gate on the rollout entropy, at their defaults: batch() sets rollout entropies that put some
    # tokens out of their band. A method that normalises over the micro-batch it is given (STEER) differs between one
    # micro-batch and two by its definition; its own test checks that a fixed layout reproduces.
    **{
        name: {"num_iterations": 2} for name in ROLLOUT_ENTROPY_METHODS if not METHODS[name].normalises_per_micro_batch
    },
}
# One micro-batch against two halves sums in another order. Each bound: the largest difference measured on
# ATEN_CPU_CAPABILITY=default, avx2 and avx512 (one AMD EPYC), the margin, and what two planted bugs produce
# (tests/_support/rounding.py measures both): a window-local controller statistic (each micro-batch's sums replacing
# the window's), and an undivided accumulation (each half's loss not divided by the accumulation steps).
# The loss step driven directly, on the same weights:
# the loss 2.6e-7 relative, margin 38; window-local 3.8e-4, undivided 1.3.
STEP_LOSS = Bound(rel=1e-5, abs=1e-7)
# each gradient 0.19 of this bound (near-zero entries: 1.5e-7 absolute), margin 5.4; window-local 3.2 times it,
# undivided 1.1e4 times.
GRADIENT = Bound(rel=1e-4, abs=1e-7)
# the controllers' states 7.7e-8 relative (AEnt's λ), margin 13; window-local 1.5e-3.
STATE = Bound(rel=1e-6, abs=1e-12)
# Three optimizer steps of the training loop (SGD), whose weights then differ by rounding:
# the statistic at each update 1.5e-7 relative, margin 13; window-local 5.5e-3, undivided 5.7e-5 from the second
# update on (the first sees the same weights).
TRAINING_STATISTIC = Bound(rel=2e-6)
# the controller after k updates, per update: 2.3e-8 relative, margin 13; window-local 2.6e-3, undivided 4.6e-6.
TRAINING_CONTROLLER = Bound(rel=3e-7, abs=1e-12)
# a gate's kept fraction: 0 on every path (a fraction of whole tokens); neither bug changes the gate.
METRIC = Bound(rel=1e-5, abs=1e-7)
# the logged loss 0.021 of this bound (3.6e-7 absolute, on losses near 0), margin 49; window-local 17 times it,
# undivided 1e4 times.
TRAINING_LOSS = Bound(rel=1e-4, abs=1e-6)
# the logged entropy 3.1e-7 relative, margin 33; undivided 1.0e-4 (window-local leaves it: the statistic catches it).
TRAINING_ENTROPY = Bound(rel=1e-5)
# the weights 0.015 of this bound, margin 67; undivided 18 times it (window-local 0.16: the statistic catches it).
TRAINING_WEIGHTS = Bound(rel=1e-5, abs=1e-6)
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
CASES = [
    (case, loss_type)
    for case in METHOD_OPTIONS
    for loss_type in LOSS_TYPES
    if loss_type in get_method(case.split("-")[0]).config_class.supported_loss_types
]
# Completion lengths of the 8 rows: each half holds 16 tokens, the rows differ.
LENGTHS = (6, 3, 1, 6, 3, 6, 6, 1)
# The adaptive methods whose controllers move once per generation cycle, and those whose controller moves at every
# training micro-batch (EntroPIC): the latter sees each half of a batch alone, so by its definition two half
# micro-batches do not reproduce one whole; what it must do instead is test_micro_batch_controller_ignores_the_window.
CYCLE_METHODS = tuple(name for name in ADAPTIVE_METHODS if not METHODS[name].moves_per_micro_batch)
MICRO_BATCH_METHODS = tuple(name for name in ADAPTIVE_METHODS if METHODS[name].moves_per_micro_batch)


def build(case, loss_type, accumulation, path, tokenizer, tmp_path):
    method = get_method(case.split("-")[0])
    options = {**method.defaults, **METHOD_OPTIONS[case]}
    args = toy_config(
        method.config_class,
        tmp_path / f"accumulation{accumulation}",
        per_device_train_batch_size=8 // accumulation,
        gradient_accumulation_steps=accumulation,
        num_generations=4,
        max_completion_length=6,
        loss_type=loss_type,
        **options,
    )
    return toy_trainer(method.trainer_class, args, path, tokenizer, accumulation=accumulation)


def batch(model, vocab_size, seed):
    inputs = make_grpo_batch(model, vocab_size, batch=8, seed=seed)
    inputs["completion_mask"] = (torch.arange(6) < torch.tensor(LENGTHS).unsqueeze(1)).long()
    inputs["num_items_in_batch"] = inputs["completion_mask"].sum()  # the generation batch's tokens
    # Rollout entropies off the model's on alternate tokens (only the methods that declare they need them read them).
    inputs[OLD_ENTROPY_KEY] = inputs[OLD_ENTROPY_KEY] * torch.tensor([1.0, 0.8, 1.0, 1.25, 1.0, 0.8])
    return inputs


def half(inputs, index):
    rows = slice(4 * index, 4 * index + 4)
    return {k: (v if k == "num_items_in_batch" else v[rows]) for k, v in inputs.items()}


def window(trainer, micro_batches, step):
    """One optimizer step's worth of loss steps; returns the summed loss and the accumulated gradients."""
    trainer.state.global_step = step
    trainer.model.zero_grad(set_to_none=True)
    total = 0.0
    for index, micro_batch in enumerate(micro_batches):
        trainer.accelerator.gradient_state._set_sync_gradients(index == len(micro_batches) - 1)
        loss = trainer.compute_loss(trainer.model, dict(micro_batch))
        loss.backward()
        total += loss.item()
    gradients = {name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.grad is not None}
    return total, gradients


def controller_states(trainer):
    states = {name: c.state_dict() for name, c in trainer.controllers.items()}
    if trainer.use_adaptive_entropy:
        states["trl"] = {"entropy_coef": trainer.entropy_coef, "last_world_entropy": trainer._last_world_entropy}
    return states


def assert_states_close(actual, expected, case: str):
    assert actual.keys() == expected.keys()
    for name in expected:
        for key, value in expected[name].items():
            if isinstance(value, float):
                check(f"layout {name}/{key}[{case}]", actual[name][key], value, STATE)
            else:
                assert actual[name][key] == value, (name, key)


@pytest.mark.parametrize("case, loss_type", CASES, ids=[f"{c}-{t}" for c, t in CASES])
def test_half_micro_batches_reproduce_one_micro_batch(case, loss_type, toy_model_path, toy_tokenizer, tmp_path):
    one = build(case, loss_type, 1, toy_model_path, toy_tokenizer, tmp_path)
    two = build(case, loss_type, 2, toy_model_path, toy_tokenizer, tmp_path)
    initial = controller_states(one)
    for step, seed in enumerate((11, 12)):
        inputs = batch(one.model, len(toy_tokenizer), seed)
        loss_one, grads_one = window(one, [inputs], step)
        loss_two, grads_two = window(two, [half(inputs, 0), half(inputs, 1)], step)
        check(f"layout loss[{case}-{loss_type}]", loss_two, loss_one, STEP_LOSS)
        assert grads_one.keys() == grads_two.keys()
        assert any(g.abs().max() > 0 for g in grads_one.values())
        for name in grads_one:
            check(f"layout gradient[{case}-{loss_type}]", grads_two[name], grads_one[name], GRADIENT)
        assert_states_close(controller_states(two), controller_states(one), f"{case}-{loss_type}")
    if initial:
        assert controller_states(one) != initial, "no controller moved: the comparison would be vacuous"


@pytest.mark.parametrize(
    "method", [*CYCLE_METHODS, *(name for name in ROLLOUT_ENTROPY_METHODS if name in METHOD_OPTIONS)]
)
def test_training_with_accumulation_reproduces_training_without(method, warm_toy_policy_path, tmp_path):
    """The training loop, on equal-length completions: the halves TRL shuffles into hold equal token counts. The
    methods that read the rollout entropy (two updates per rollout) gate the same tokens with either split."""
    rollout = make_rollout(lengths=(3, 3, 3, 3))
    runs = []
    for accumulation in (1, 2):
        trainer = make_trainer(
            method,
            warm_toy_policy_path,
            str(tmp_path / f"accumulation{accumulation}"),
            rollout=rollout,
            per_device_train_batch_size=8 // accumulation,
            gradient_accumulation_steps=accumulation,
            max_steps=3,
            optim="sgd",  # Adam would hide a wrong gradient scale, and magnifies rounding in near-zero gradients
            learning_rate=0.05,
        )
        recorder = ControllerRecorder.attached_to(trainer)
        trainer.train()
        runs.append((trainer, recorder))
    (one, one_recorder), (two, two_recorder) = runs
    one_values, two_values = one_recorder.values, two_recorder.values
    assert len(one_values) == 3
    if method in ADAPTIVE_METHODS:
        assert len(set(one_values)) > 1
        (one_statistics,) = one_recorder.statistics.values()
        (two_statistics,) = two_recorder.statistics.values()
        assert len(one_statistics) == 3
        for update, (two_value, one_value) in enumerate(zip(two_statistics, one_statistics, strict=True)):
            check(f"layout training statistic[{method}] #{update + 1}", two_value, one_value, TRAINING_STATISTIC)
        check_per_update(f"layout training controller[{method}]", two_values, one_values, TRAINING_CONTROLLER)
    else:
        assert one_values == two_values == [None] * 3  # no controller
    for metric in get_method(method).metrics if method in ROLLOUT_ENTROPY_METHODS else ():
        check(f"layout training {metric.key}[{method}]", logged(two, metric.key), logged(one, metric.key), METRIC)
        assert len(set(logged(one, metric.key))) > 1, f"{metric.key} never moved: the check would be weak"
    check(f"layout training loss[{method}]", logged(two, "loss"), logged(one, "loss"), TRAINING_LOSS)
    check(f"layout training entropy[{method}]", logged(two, "entropy"), logged(one, "entropy"), TRAINING_ENTROPY)
    one_weights = [weight for _, weight in sorted(one.model.named_parameters())]
    two_weights = [weight for _, weight in sorted(two.model.named_parameters())]
    check(f"layout training weights[{method}]", two_weights, one_weights, TRAINING_WEIGHTS)


@pytest.mark.parametrize("method", MICRO_BATCH_METHODS)
def test_micro_batch_controller_ignores_the_window(method, toy_model_path, toy_tokenizer, tmp_path):
    """A controller its method moves at every training micro-batch: the same micro-batches, on the same weights, in one
    accumulation window of two or in two windows of one (the cycle is two micro-batches either way) give the same
    states after each; it moves at each micro-batch, and the base's cycle never updates it."""
    method_spec = get_method(method)
    trainers = []
    for accumulation in (1, 2):
        args = toy_config(
            method_spec.config_class,
            tmp_path / f"accumulation{accumulation}",
            per_device_train_batch_size=4,
            gradient_accumulation_steps=accumulation,
            steps_per_generation=2,
            num_generations=4,
            max_completion_length=6,
            **method_spec.defaults,
        )
        trainer = toy_trainer(
            method_spec.trainer_class, args, toy_model_path, toy_tokenizer, accumulation=accumulation
        )
        assert all(controller.cadence == "micro_batch" for controller in trainer.controllers.values())
        trainers.append(trainer)
    inputs = batch(trainers[0].model, len(toy_tokenizer), 14)
    states = {1: [], 2: []}
    for accumulation, trainer in zip((1, 2), trainers, strict=True):
        before = controller_states(trainer)
        for index in (0, 1):
            last = accumulation == 1 or index == 1  # the micro-batch that ends its window
            trainer.accelerator.gradient_state._set_sync_gradients(last)
            trainer.compute_loss(trainer.model, dict(half(inputs, index))).backward()
            states[accumulation].append(controller_states(trainer))
        assert before != states[accumulation][0] != states[accumulation][1], "it must move at every micro-batch"
    for one, two in zip(states[1], states[2], strict=True):
        assert_states_close(two, one, method)


def test_controller_statistic_is_the_window_token_mean_whatever_the_split(
    warm_toy_policy_path, toy_tokenizer, tmp_path
):
    """Halves with unequal token counts: the controller still sees the token mean of the whole window."""
    one = build("repo_r", "dapo", 1, warm_toy_policy_path, toy_tokenizer, tmp_path)
    two = build("repo_r", "dapo", 2, warm_toy_policy_path, toy_tokenizer, tmp_path)
    for trainer in (one, two):
        trainer.controllers["repo"].entropy_target = None  # the first update records its statistic as the target
    inputs = batch(one.model, len(toy_tokenizer), 13)
    inputs["completion_mask"] = (torch.arange(6) < torch.tensor([6, 6, 5, 6, 1, 2, 1, 1]).unsqueeze(1)).long()
    inputs["num_items_in_batch"] = inputs["completion_mask"].sum()
    window(one, [inputs], 0)
    window(two, [half(inputs, 0), half(inputs, 1)], 0)
    measured = one.controllers["repo"].entropy_target
    assert measured is not None
    assert two.controllers["repo"].entropy_target == pytest.approx(measured, rel=1e-6)
    # ... which is not the mean of the two halves' means.
    halves = []
    for index in (0, 1):
        probe = build("repo_r", "dapo", 1, warm_toy_policy_path, toy_tokenizer, tmp_path / f"half{index}")
        probe.controllers["repo"].entropy_target = None
        window(probe, [half(inputs, index)], 0)
        halves.append(probe.controllers["repo"].entropy_target)
    assert abs(sum(halves) / 2 - measured) > 1e-3


# ---------------------------------------------------------------------------------------------------------------------
# One controller update per generation cycle
# ---------------------------------------------------------------------------------------------------------------------

# (gradient_accumulation_steps, config options, optimizer steps that update among 1..4). A cycle is num_iterations ×
# steps_per_generation micro-batches; an optimizer step, gradient_accumulation_steps micro-batches.
CYCLES = {
    "num_iterations=2": (1, {"num_iterations": 2, "per_device_train_batch_size": 8}, [2, 4]),
    "steps_per_generation=2x_accumulation": (2, {"steps_per_generation": 4, "per_device_train_batch_size": 4}, [2, 4]),
    "accumulation=2x_cycle": (2, {"steps_per_generation": 1, "per_device_train_batch_size": 8}, [1, 2, 3, 4]),
}


@pytest.mark.parametrize("setting", sorted(CYCLES))
@pytest.mark.parametrize("method", ["aent", "repo_r", "adapo"])
def test_controllers_update_once_per_generation_cycle(method, setting, warm_toy_policy_path, tmp_path):
    """The controllers' timing: the statistic is the token mean over every micro-batch of the cycle; the controller
    updates once, at the optimizer step that ends the cycle (an optimizer step spanning two cycles: at its end), and
    its value holds in between."""
    accumulation, options, update_steps = CYCLES[setting]
    if method == "aent":
        options = dict(options, aent_clamp_fraction=0.0)  # AEnt's statistic is then the full entropy, computed below
    trainer = make_trainer(
        method, warm_toy_policy_path, str(tmp_path), max_steps=4, gradient_accumulation_steps=accumulation, **options
    )
    assert trainer.temperature == 1.0
    (controller,) = trainer.controllers.values()
    initial = controller.value

    sums = []  # float64 [Σ m·H, Σ m] of each training micro-batch, with the weights it was trained on
    compute_loss = trainer._compute_loss

    def recording_compute_loss(model, inputs):
        entropy, mask = naive_entropy(model, inputs), inputs["completion_mask"].double()
        sums.append(((entropy * mask).sum().item(), mask.sum().item()))
        return compute_loss(model, inputs)

    updates, update = [], controller.update

    def recording_update(mean, step):
        updates.append((mean, step, len(sums)))
        update(mean, step)

    trainer._compute_loss = recording_compute_loss
    controller.update = recording_update
    recorder = ControllerRecorder.attached_to(trainer)
    trainer.train()

    assert len(sums) == 4 * accumulation
    assert [step for _, step, _ in updates] == update_steps
    start = 0
    for mean, step, seen in updates:
        assert seen == step * accumulation  # at the end of the optimizer step
        cycle = sums[start:seen]  # every micro-batch since the last update
        assert mean == pytest.approx(sum(s for s, _ in cycle) / sum(n for _, n in cycle), rel=1e-5)
        start = seen
    # The value moves, and only at the update steps.
    values = [initial, *recorder.values]  # before training, then at the end of each optimizer step
    moved = [step for step in range(1, 5) if values[step] != values[step - 1]]
    assert moved and set(moved) <= set(update_steps), values
