"""The coefficient schedules as pure functions: the worked example's values number for number, the formula in float64
written out here at every step, the generation-cycle clock, and the config's refusals."""

import math

import pytest

from trl_entropy import EntropyGRPOConfig
from trl_entropy.core.schedules import Schedule, bound_schedule, run_clock, schedule_clock


# The worked example: c_0 = 0.02 → c_1 = 0 over S = 1000 steps, warm-up w = 100 from 0 (values to 4 decimals).
STEPS = [0, 50, 100, 325, 550, 775, 999, 1000]
WARMED = {
    "linear": [0.0, 0.0100, 0.0200, 0.0150, 0.0100, 0.0050, 0.0000, 0.0],
    "cosine": [0.0, 0.0100, 0.0200, 0.0171, 0.0100, 0.0029, 0.0000, 0.0],
}
# TRL issue #5584's example: no warm-up, D = 1000, linear.
ISSUE = [0.0200, 0.0190, 0.0180, 0.0135, 0.0090, 0.0045, 0.0000, 0.0]


def reference(kind, s, c0, c1, w, cw, decay, total):
    """The schedule's definition in float64, as the docs write it."""
    if s < w:
        return cw + (c0 - cw) * s / w
    if kind == "constant":
        return c0
    d = total - w if decay is None else decay
    u = min(max((s - w) / max(d, 1), 0.0), 1.0)
    return c0 + (c1 - c0) * u if kind == "linear" else c1 + (c0 - c1) * 0.5 * (1 + math.cos(math.pi * u))


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_the_worked_example_number_for_number(kind):
    schedule = Schedule(kind, start=0.02, final=0.0, warmup_steps=100, warmup_start=0.0)
    assert [round(schedule.value(s, 1000), 4) for s in STEPS] == WARMED[kind]
    # One step before the end: 0.02/900 linear; 0.01·(1 − cos(π/900)) ≈ 0.01·(π/900)²/2 cosine.
    last = 0.02 / 900 if kind == "linear" else 0.01 * (math.pi / 900) ** 2 / 2
    assert schedule.value(999, 1000) == pytest.approx(last, rel=1e-4)


def test_the_issues_example():
    schedule = Schedule("linear", start=0.02, final=0.0, decay_steps=1000)
    assert [round(schedule.value(s, None), 4) for s in STEPS] == ISSUE


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
@pytest.mark.parametrize(("w", "decay"), [(0, None), (7, None), (7, 20), (0, 200)])
def test_every_step_equals_the_float64_formula(kind, w, decay):
    schedule = Schedule(kind, start=0.3, final=-0.1, warmup_steps=w, warmup_start=0.05, decay_steps=decay)
    for s in range(0, 60):
        expected = reference(kind, s, 0.3, -0.1, w, 0.05, decay, 50)
        assert schedule.value(s, 50) == pytest.approx(expected, rel=1e-12, abs=1e-15), s


def test_the_final_value_is_reached_after_the_last_step_and_held():
    schedule = Schedule("linear", start=1.0, final=0.0)
    assert schedule.value(9, 10) == pytest.approx(0.1) and schedule.value(10, 10) == 0.0 == schedule.value(15, 10)
    assert schedule.progress(5, 10) == 0.5 and schedule.progress(3, 10) == 0.3


def test_the_generation_cycle_clock_freezes_the_value_within_a_cycle():
    assert [schedule_clock(s, 12, "generation_cycle", 3.0) for s in range(7)] == [
        (0, 4),
        (0, 4),
        (0, 4),
        (1, 4),
        (1, 4),
        (1, 4),
        (2, 4),
    ]
    assert schedule_clock(5, 12, "optimizer_step", 3.0) == (5, 12)
    assert schedule_clock(5, 12, "generation_cycle", 0.5) == (5, 12)  # several cycles in a step: the step's clock


@pytest.mark.parametrize("num_iterations", [1, 2, 3])
@pytest.mark.parametrize(("steps_per_generation", "accumulation"), [(2, 2), (4, 2), (2, 4), (3, 1)])
def test_the_run_clock_counts_cycles_of_every_pass(steps_per_generation, accumulation, num_iterations, tmp_path):
    """A cycle is ``steps_per_generation · num_iterations`` micro-batches, an optimizer step ``accumulation`` of them:
    optimizer step ``s`` of ``S`` is cycle ``⌊s·a / (g·n)⌋`` of ``⌊S·a / (g·n)⌋`` (integers, written out here). With
    g = a = n = 2, step 2 of 10 is cycle 1 of 5; a clock that dropped the passes would say cycle 2 of 10."""
    config = EntropyGRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        entropy_schedule_unit="generation_cycle",
        steps_per_generation=steps_per_generation,
        gradient_accumulation_steps=accumulation,
        num_iterations=num_iterations,
    )
    micro_batches_per_cycle = steps_per_generation * num_iterations
    for max_steps in (10, 12):
        expected = [
            (s * accumulation // micro_batches_per_cycle, max_steps * accumulation // micro_batches_per_cycle)
            if micro_batches_per_cycle > accumulation  # a step of several cycles counts on the step's clock
            else (s, max_steps)
            for s in range(max_steps + 1)
        ]
        assert [run_clock(config, s, max_steps, num_iterations) for s in range(max_steps + 1)] == expected
    if (steps_per_generation, accumulation, num_iterations) == (2, 2, 2):
        assert run_clock(config, 2, 10, num_iterations) == (1, 5)


def test_a_schedule_from_zero_still_has_a_bonus_and_a_constant_one_does_not_move():
    assert Schedule("linear", start=0.0, final=0.02).ever_nonzero
    assert Schedule("constant", start=0.0, warmup_steps=5, warmup_start=0.01).ever_nonzero
    assert not Schedule("constant", start=0.0).ever_nonzero and not Schedule("constant", start=0.01).moves


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"entropy_coef_schedule": "linear"}, "needs entropy_coef_final"),
        (
            {"entropy_coef_schedule": "cosine", "entropy_coef_final": 0.0, "use_adaptive_entropy": True},
            "entropy_coef_schedule='cosine'.*use_adaptive_entropy=True both set",
        ),
        ({"entropy_coef_warmup_steps": 3, "use_adaptive_entropy": True}, "entropy_coef_warmup_steps=3"),
        ({"entropy_coef_warmup_steps": -1}, "entropy_coef_warmup_steps=-1 is invalid"),
        ({"entropy_coef_decay_steps": 0}, "entropy_coef_decay_steps=0 is invalid"),
        ({"entropy_schedule_unit": "epoch"}, "entropy_schedule_unit='epoch' is invalid"),
        ({"entropy_coef_decay_steps": 10}, "entropy_coef_decay_steps=10 would be ignored: .*does not decay"),
        (
            {"entropy_coef_final": 0.0, "entropy_coef_schedule": "linear", "entropy_coef_warmup_start": 0.1},
            "no warm-up",
        ),
    ],
)
def test_a_bad_schedule_is_refused_naming_its_fields(options, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        EntropyGRPOConfig(output_dir=str(tmp_path), use_cpu=True, entropy_coef=0.01, **options)


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_a_bound_holds_its_value_through_the_warm_up_then_follows_the_formula(kind):
    """A bound has no warm-up start of its own: c_w = c_0; None as its final value keeps it fixed."""
    schedule = bound_schedule(kind, start=0.02, final=0.0, warmup_steps=100, decay_steps=None)
    for s in range(0, 1100, 25):
        assert schedule.value(s, 1000) == pytest.approx(
            reference(kind, s, 0.02, 0.0, 100, 0.02, None, 1000), abs=1e-15
        )
    assert [schedule.value(s, 1000) for s in (0, 50, 99, 100)] == [0.02] * 4
    assert [round(schedule.value(s, 1000), 4) for s in (325, 550, 775)] == WARMED[kind][3:6]
    assert bound_schedule(kind, 0.3, None, 100, None).value(550, 1000) == 0.3
