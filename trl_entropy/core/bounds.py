"""A method's bounds that one schedule moves (an entropy band, a coefficient box), and a method's coefficient on a
schedule (``ScheduledCoefficient``): their config fields, the checks across them and their values at a step. Each
bound field ``<name>`` moves from its value to ``<name>_final`` (None: it stays) under the schedule field ``<kind>``
and its ``<kind>_warmup_steps`` and ``<kind>_decay_steps``, which mean what ``entropy_coef_schedule``,
``entropy_coef_warmup_steps`` and ``entropy_coef_decay_steps`` mean for TRL's entropy coefficient (docs/schedules.md),
on the same clock (``entropy_schedule_unit``); through the warm-up a bound holds its value.
"""

from dataclasses import Field, dataclass, field

from .config import Range, config_field
from .schedules import SCHEDULES, CoefficientSchedule, Schedule, bound_schedule, require_run_length, run_clock


@dataclass(frozen=True)
class ScheduledBounds:
    """The bounds ``pairs`` (``(lower, upper)`` fields that must stay ordered) moved by the schedule field ``kind``;
    ``needs``: the flag field without which the bounds are unused (None: always used); ``starts_inside`` (with
    ``needs``): ``{field: pair}``, a value that must start inside the pair while ``needs`` is on (a controller's
    initial value in its box)."""

    kind: str
    pairs: tuple[tuple[str, str], ...]
    needs: str | None = None
    starts_inside: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def warmup(self) -> str:
        return f"{self.kind}_warmup_steps"

    @property
    def decay(self) -> str:
        return f"{self.kind}_decay_steps"

    # The fields, each declared in the method's config as `<field name>: <type> = bounds.<x>_field(...)`.

    def kind_field(self) -> Field:
        finals = ", ".join(f"{name}_final" for name in self.bounds)
        return config_field(
            "constant",
            f"Schedule of {self.moved} over training: 'constant' (fixed), or 'linear' or 'cosine' from each bound's "
            f"value to its final value ({finals}; a bound without one stays fixed), after {self.warmup}, over "
            f"{self.decay}, on the clock of entropy_schedule_unit. See docs/schedules.md.",
            choices=SCHEDULES,
        )

    def final_field(self, bound: str) -> Field:
        return config_field(
            None,
            f"Final value of {bound} under {self.kind}, reached at the run's last step (or after {self.decay}).",
            valid=Range(0),
            none_means=f"({bound} stays fixed)",
        )

    def warmup_field(self) -> Field:
        return config_field(
            0,
            f"Steps (or cycles, see entropy_schedule_unit) during which {self.moved} hold their start values before "
            f"{self.kind} moves them; 0: no warm-up.",
            valid=Range(0, integer=True),
        )

    def decay_field(self) -> Field:
        return config_field(
            None,
            f"Steps (or cycles) from the end of {self.warmup} to the final values of {self.moved}.",
            valid=Range(1, integer=True),
            none_means="(to the run's last step, max_steps)",
        )

    # The values

    @property
    def bounds(self) -> tuple[str, ...]:
        return tuple(name for pair in self.pairs for name in pair)

    @property
    def moved(self) -> str:
        """The bounds, as the fields' help names them."""
        return f"{', '.join(self.bounds[:-1])} and {self.bounds[-1]}"

    def widest(self, config) -> dict[str, float]:
        """Each bound at its widest over the run (a lower bound's least value, an upper bound's greatest): every
        step's bounds lie within these, since a schedule moves monotonically from a bound's value to its final."""
        ends = {name: (getattr(config, name), getattr(config, f"{name}_final")) for name in self.bounds}
        ends = {name: [value for value in pair if value is not None] for name, pair in ends.items()}
        return {name: (min if name in dict(self.pairs) else max)(ends[name]) for name in self.bounds}

    def moves(self, config) -> bool:
        return getattr(config, self.kind) != "constant"

    def schedules(self, config) -> dict[str, Schedule]:
        kind, warmup, decay = (getattr(config, name) for name in (self.kind, self.warmup, self.decay))
        return {
            name: bound_schedule(kind, getattr(config, name), getattr(config, f"{name}_final"), warmup, decay)
            for name in self.bounds
        }

    def values(self, config, global_step: int, max_steps: int, num_iterations: int) -> dict[str, float]:
        """Each bound's value at optimizer step ``global_step`` (TRL's, 0 during the first) of ``max_steps``."""
        step, total = run_clock(config, global_step, max_steps, num_iterations)
        schedules = self.schedules(config)
        require_run_length(schedules.values(), total, self.kind, self.decay)
        return {name: schedule.value(step, total) for name, schedule in schedules.items()}

    def now(self, trainer) -> dict[str, float]:
        """Each bound's value at the optimizer step ``trainer`` is running (between steps: the next one)."""
        state = trainer.state
        return self.values(trainer.args, state.global_step, state.max_steps, trainer.num_iterations)

    # The checks

    def check(self, config) -> None:
        """Refuse, naming the fields: a setting the constant schedule would ignore, a moving schedule with no final
        value or without ``needs``, a pair out of order at either end (a pair shares its schedule's shape and timing,
        so being in order at both ends keeps it in order at every step), and a value outside its pair at the start."""
        kind = getattr(config, self.kind)
        finals = [f"{name}_final" for name in self.bounds]
        given = [name for name in finals if getattr(config, name) is not None]
        if kind == "constant":
            ignored = given + [name for name in (self.warmup, self.decay) if getattr(config, name) not in (0, None)]
            if ignored:
                raise ValueError(
                    f"{ignored[0]}={getattr(config, ignored[0])!r} would be ignored: {self.kind}='constant' moves no "
                    f"bound. Set {self.kind} to 'linear' or 'cosine', or leave {ignored[0]} out."
                )
        elif not given:
            raise ValueError(f"{self.kind}={kind!r} moves nothing: set a final value ({', '.join(finals)}).")
        elif self.needs is not None and not getattr(config, self.needs):
            raise ValueError(
                f"{self.kind}={kind!r} moves bounds that {self.needs}=False leaves unused: set {self.needs}=True, or "
                f"{self.kind}='constant' without {', '.join(given)}."
            )
        for low, high in self.pairs:
            for end in ("", "_final"):
                low_name = f"{low}{end}" if getattr(config, f"{low}{end}") is not None else low
                high_name = f"{high}{end}" if getattr(config, f"{high}{end}") is not None else high
                low_value, high_value = getattr(config, low_name), getattr(config, high_name)
                if low_value > high_value:
                    raise ValueError(
                        f"{low_name}={low_value!r} is above {high_name}={high_value!r}; {low} must stay at or below "
                        f"{high} at every step: set {low_name} <= {high_name}."
                    )
        for name, (low, high) in self.starts_inside.items():
            value, low_value, high_value = getattr(config, name), getattr(config, low), getattr(config, high)
            if getattr(config, self.needs) and not low_value <= value <= high_value:
                raise ValueError(
                    f"{name}={value!r} lies outside [{low}, {high}] = [{low_value!r}, {high_value!r}]; the first "
                    f"update would clip it there at once. Move it inside (or widen them), or set {self.needs}=False "
                    "to keep it fixed."
                )


@dataclass(frozen=True)
class ScheduledCoefficient(CoefficientSchedule):
    """A method's coefficient on a schedule (``CoefficientSchedule``: its value, its checks) with the config fields to
    declare it, named as TRL's ``entropy_coef`` ones; ``what`` names the coefficient in their help."""

    what: str = ""

    def kind_field(self) -> Field:
        return config_field(
            "constant",
            f"Schedule of {self.what} ({self.name}) over training: 'constant', or 'linear' or 'cosine' to "
            f"{self.name}_final (reached after the last step), after {self.name}_warmup_steps, on the clock of "
            "entropy_schedule_unit. See docs/schedules.md.",
            choices=SCHEDULES,
        )

    def final_field(self) -> Field:
        return config_field(
            None,
            f"Final value of {self.name} under a 'linear' or 'cosine' {self.name}_schedule.",
            valid=Range(0),
            none_means="(no final value: the schedule must be 'constant')",
        )

    def warmup_field(self) -> Field:
        return config_field(
            0,
            f"Steps (or cycles, see entropy_schedule_unit) over which {self.name} rises linearly from "
            f"{self.name}_warmup_start; 0: no warm-up.",
            valid=Range(0, integer=True),
        )

    def warmup_start_field(self) -> Field:
        return config_field(0.0, f"{self.what} at the start of {self.name}_warmup_steps.", valid=Range(0))

    def decay_field(self) -> Field:
        return config_field(
            None,
            f"Steps (or cycles) from the end of the warm-up to {self.name}_final.",
            valid=Range(1, integer=True),
            none_means="(to the run's last step, max_steps)",
        )
