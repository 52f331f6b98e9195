"""Coefficient schedules, as pure functions: a value that moves with the training clock from a start to a final value,
after an optional warm-up. What TRL users asked for in TRL's issue #5584 (an entropy coefficient that decays over
training), with the bonus's gradient intact (docs/schedules.md).

The clock ``s`` is the optimizer step (TRL's ``state.global_step`` while a step runs: 0 during the first), or the
generation cycle ``floor(s / n_c)``; ``S`` is the run's last step on that clock. Warm-up for ``s < w``:
``c(s) = c_w + (c_0 − c_w)·s/w``; after it ``u = clamp((s − w)/max(D, 1), 0, 1)`` with ``D`` the decay steps (``S − w``
when not given), and ``c = c_0`` (constant), ``c_0 + (c_1 − c_0)·u`` (linear) or ``c_1 + (c_0 − c_1)·½(1 + cos πu)``
(cosine). The final value is reached at ``s = S``, as transformers' linear learning-rate schedule reaches 0.

A method's bounds (an entropy band, a coefficient box) follow the same schedules (:func:`bound_schedule`; their
fields and checks: ``core/bounds.py``): each bound from its value to its final one, holding it through the warm-up.
"""

import math
from dataclasses import dataclass


SCHEDULES = ("constant", "linear", "cosine")
SCHEDULE_UNITS = ("optimizer_step", "generation_cycle")


@dataclass(frozen=True)
class Schedule:
    """``kind`` from ``start`` (``c_0``) to ``final`` (``c_1``; unused by ``"constant"``), after ``warmup_steps``
    (``w``) from ``warmup_start`` (``c_w``), decaying over ``decay_steps`` (``D``; None: to the end of the run)."""

    kind: str = "constant"
    start: float = 0.0
    final: float | None = None
    warmup_steps: int = 0
    warmup_start: float = 0.0
    decay_steps: int | None = None

    @property
    def moves(self) -> bool:
        """False for a constant value without warm-up: the clock plays no part."""
        return self.kind != "constant" or self.warmup_steps > 0

    @property
    def ever_nonzero(self) -> bool:
        """Whether any step's value can differ from 0."""
        values = [self.start]
        values += [self.final] if self.kind != "constant" and self.final is not None else []
        values += [self.warmup_start] if self.warmup_steps > 0 else []
        return any(value != 0 for value in values)

    def progress(self, step: int, total: int | None) -> float:
        """``u`` at clock ``step`` of ``total``: 0 through the warm-up, 1 from the end of the decay on."""
        if step < self.warmup_steps:
            return 0.0
        decay = self.decay_steps
        if decay is None:
            if total is None:
                raise ValueError("the schedule decays to the end of the run, whose length is unknown")
            decay = total - self.warmup_steps
        return min(max((step - self.warmup_steps) / max(decay, 1), 0.0), 1.0)

    def value(self, step: int, total: int | None) -> float:
        """The value at clock ``step`` of a run of ``total`` (its last step; None: unknown)."""
        if step < self.warmup_steps:
            return self.warmup_start + (self.start - self.warmup_start) * step / self.warmup_steps
        if self.kind == "constant":
            return self.start
        u = self.progress(step, total)
        if self.kind == "linear":
            return self.start + (self.final - self.start) * u
        return self.final + (self.start - self.final) * 0.5 * (1 + math.cos(math.pi * u))


def schedule_clock(global_step: int, max_steps: int, unit: str, steps_per_cycle: float) -> tuple[int, int]:
    """``(s, S)`` on the schedule's clock: the optimizer step and the run's steps, or the generation cycle and the
    run's cycles (``steps_per_cycle`` optimizer steps each, at least one)."""
    if unit == "optimizer_step":
        return global_step, max_steps
    per_cycle = max(steps_per_cycle, 1.0)
    return math.floor(global_step / per_cycle), math.floor(max_steps / per_cycle)


def run_clock(args, global_step: int, max_steps: int, num_iterations: int) -> tuple[int, int]:
    """``(s, S)`` of optimizer step ``global_step`` of ``max_steps`` on the clock ``entropy_schedule_unit``."""
    steps_per_cycle = args.steps_per_generation * num_iterations / args.gradient_accumulation_steps
    return schedule_clock(global_step, max_steps, args.entropy_schedule_unit, steps_per_cycle)


def require_run_length(schedules, total: int, schedule_field: str, decay_field: str) -> None:
    """Refuse, naming the fields, schedules that decay to the run's last step when the run's length is unknown."""
    if total <= 0 and any(s.kind != "constant" and s.decay_steps is None for s in schedules):
        raise ValueError(
            f"{schedule_field} decays until the run's last step, which is unknown (no max_steps): set {decay_field}."
        )


def scheduled_entropy_coef(args, global_step: int, max_steps: int, num_iterations: int) -> tuple[float, float]:
    """``(coefficient, u)`` of TRL's entropy bonus at optimizer step ``global_step`` of ``max_steps`` under the
    config's schedule (``args.entropy_schedule()``), on its clock (``entropy_schedule_unit``)."""
    schedule = args.entropy_schedule()
    step, total = run_clock(args, global_step, max_steps, num_iterations)
    require_run_length([schedule], total, "entropy_coef_schedule", "entropy_coef_decay_steps")
    return schedule.value(step, total), schedule.progress(step, total) if schedule.kind != "constant" else 0.0


def bound_schedule(
    kind: str, start: float, final: float | None, warmup_steps: int, decay_steps: int | None
) -> Schedule:
    """A bound from ``start`` to ``final`` under ``kind`` (``final`` None: it stays at ``start``); it holds ``start``
    through the warm-up, since a bound has no value of its own to rise from."""
    if final is None:
        return Schedule(start=start)
    return Schedule(kind, start, final, warmup_steps, warmup_start=start, decay_steps=decay_steps)
