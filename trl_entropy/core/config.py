"""``EntropyGRPOBaseConfig``, the base of every method's config, and the validators the methods' configs share."""

import math
from dataclasses import Field, dataclass, field, fields
from typing import ClassVar

from transformers.utils import logging
from trl import GRPOConfig
from trl.trainer.utils import get_config_model_id

from .schedules import ENTROPY_COEF_SCHEDULE, SCHEDULE_UNITS, SCHEDULES, Schedule
from .trl.objectives import LOSS_TYPES
from .warn import warn_user


KERNEL_BACKENDS = ("auto", "torch", "triton")
logger = logging.get_logger(__name__)


@dataclass(frozen=True)
class Range:
    """The numbers a field accepts: from ``low`` to ``high``, ``ends`` saying which ends belong ("[]", "[)", "(]" or
    "()"). ``integer``: ints only. ``finite``: infinities refused. Bools and NaN are never numbers here.
    ``unbounded_because``: why every finite number is valid, for a range without ends on purpose."""

    low: float = -math.inf
    high: float = math.inf
    ends: str = "[]"
    integer: bool = False
    finite: bool = True
    unbounded_because: str = ""

    def holds(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, int if self.integer else (int, float)):
            return False
        if math.isnan(value) or (self.finite and math.isinf(value)):
            return False
        above = value >= self.low if self.ends[0] == "[" else value > self.low
        below = value <= self.high if self.ends[1] == "]" else value < self.high
        return above and below

    def __str__(self) -> str:
        kind = "an integer" if self.integer else "a finite number" if self.finite else "a number (infinities allowed)"
        if self.low == -math.inf and self.high == math.inf:
            return kind
        if self.high == math.inf:
            return f"{kind} {'>=' if self.ends[0] == '[' else '>'} {self.low:g}"
        if self.low == -math.inf:
            return f"{kind} {'<=' if self.ends[1] == ']' else '<'} {self.high:g}"
        return f"{kind} in {self.ends[0]}{self.low:g}, {self.high:g}{self.ends[1]}"


@dataclass(frozen=True)
class Rule:
    """What one field accepts: a number in ``valid``, one of ``choices``, or a bool (``flag``); ``None`` too where
    ``none_means`` says what it means. ``note`` ends the error message (why the rule is there)."""

    valid: Range | None = None
    choices: tuple | None = None
    flag: bool = False
    none_means: str | None = None
    note: str = ""

    def accepts(self, value) -> bool:
        if value is None and self.none_means is not None:
            return True
        if self.flag:
            return isinstance(value, bool)
        if self.choices is not None:
            return isinstance(value, str) and value in self.choices
        return self.valid.holds(value)

    def __str__(self) -> str:
        what = "True or False" if self.flag else f"one of {list(self.choices)}" if self.choices else str(self.valid)
        if self.none_means is not None:
            what += f", or None {self.none_means}"
        return f"{what} {self.note}" if self.note else what

    def check(self, name: str, value) -> None:
        if not self.accepts(value):
            raise ValueError(f"{name}={value!r} is invalid: it must be {self}.")


# Each config field declared with `config_field` -> its rule. The rule stays out of the field's metadata: TRL's
# argument parser hands every metadata key to argparse, which refuses keys it does not know.
FIELD_RULES: dict[Field, Rule] = {}
STRICTER = "(stricter than trl.GRPOConfig, which accepts it and then fails or trains nothing)"
# Values of TRL's own fields that TRL accepts (or rejects quoting another number) but that cannot train.
TRL_FIELD_RULES: dict[str, Rule] = {
    "num_iterations": Rule(Range(1, integer=True), note=STRICTER),
    "epsilon": Rule(Range(0), note=STRICTER),
    "epsilon_high": Rule(Range(0), none_means="(epsilon_high = epsilon)", note=STRICTER),
    "beta": Rule(Range(0), note=STRICTER),
    "top_entropy_quantile": Rule(Range(0, 1)),
}


def config_field(
    default,
    help: str,
    *,
    valid: Range | None = None,
    choices: tuple[str, ...] | None = None,
    none_means: str | None = None,
    note: str = "",
    flag: bool | None = None,
):
    """A config field with its ``help`` and the values it accepts: a bool default makes a flag (True or False; ``flag``
    says so where the default is None), a ``valid`` range a number, ``choices`` a string (the command line lists them
    too)."""
    metadata = {"help": help} | ({"choices": list(choices)} if choices else {})
    declared = field(default=default, metadata=metadata)
    flag = isinstance(default, bool) if flag is None else flag
    if flag or valid is not None or choices is not None:
        FIELD_RULES[declared] = Rule(valid, choices, flag, none_means, note)
    return declared


def field_rule(config_class: type, name: str) -> Rule | None:
    """The rule of ``config_class``'s field ``name``: its own, or ours for TRL's field; None where there is none."""
    return FIELD_RULES.get(config_class.__dataclass_fields__[name]) or TRL_FIELD_RULES.get(name)


def validate_fields(config) -> None:
    """Every field with a rule holds a value the rule accepts; the error names the field, the value and the rule."""
    for declared in fields(config):
        rule = field_rule(type(config), declared.name)
        if rule is not None:
            rule.check(declared.name, getattr(config, declared.name))


def reject_trl_entropy_bonus(config, method: str) -> None:
    """Refuse TRL's own entropy bonus next to a method that controls entropy itself.

    Two entropy controls at once are almost certainly a mistake, unless the bonus is selected as a method of its own
    next to this one (``entropy_control``), on its axis of the loss step.
    """
    if config.selects_trl_entropy_bonus:
        return
    if config.entropy_coef != 0.0 or config.use_adaptive_entropy:
        raise ValueError(
            f"{method} controls entropy itself; TRL's entropy bonus on top of it would be a second entropy bonus: got "
            f"entropy_coef={config.entropy_coef!r} and use_adaptive_entropy={config.use_adaptive_entropy!r}. "
            "Set entropy_coef=0.0 and use_adaptive_entropy=False."
        )


def warn_if_on_policy(config, subject: str, consequence: str, acts: str) -> None:
    """Warn once, naming the settings that would make ``subject`` act, when training is fully on-policy: every
    generation batch serves a single optimizer step, so every importance ratio is 1 (``ℓ^old = ℓ``).

    ``consequence`` says what that does to the method, ``acts`` completes "Set ... for {acts}."
    """
    generate_every = config.steps_per_generation * config.num_iterations
    if config.gradient_accumulation_steps % generate_every == 0:
        warn_user(
            f"{subject} with fully on-policy updates (gradient_accumulation_steps is a multiple of "
            f"steps_per_generation * num_iterations = {generate_every}): {consequence} Set num_iterations > 1 or "
            f"steps_per_generation > gradient_accumulation_steps for {acts}."
        )


def validate_eval_batch(config) -> None:
    """Every evaluation batch holds whole groups (TRL accepts a batch that splits one)."""
    generations = config.num_generations_eval or config.num_generations
    evaluates = config.eval_strategy not in ("no", None) or config.do_eval
    eval_batch = config.per_device_eval_batch_size
    if evaluates and isinstance(generations, int) and generations > 0 and eval_batch % generations:
        raise ValueError(
            f"per_device_eval_batch_size={eval_batch!r} is invalid: it must be a multiple of num_generations_eval "
            f"(or num_generations) = {generations}, so that every evaluation batch holds whole groups {STRICTER}."
        )


def refuse_loss_type(loss_type: str, method: str, config_class: type) -> None:
    """Refuse ``loss_type`` where ``config_class`` (``method``'s config) does not support it, quoting its reason."""
    if loss_type not in config_class.supported_loss_types:
        reason = config_class.unsupported_loss_type_reasons.get(loss_type)
        reason = f": {reason}" if reason else ""
        raise ValueError(
            f"{method} does not support loss_type={loss_type!r}{reason}; "
            f"choose one of {list(config_class.supported_loss_types)}."
        )


# The entropy target of a controller (REPO's, ADAPO's): a positive number of nats, or measured.
ENTROPY_TARGET = dict(valid=Range(0, ends="(]"), none_means="to measure it on the first generation cycle")
# A fraction of the valid tokens (a covariance selection's size).
TOKEN_FRACTION = dict(valid=Range(0, 1, "(]"), note="(a fraction of the valid tokens)")


@dataclass
class EntropyGRPOBaseConfig(GRPOConfig):
    r"""
    The base of every config of this library: every field of [`~trl.GRPOConfig`] plus the entropy kernel's settings.

    With no method, [`EntropyGRPOTrainer`] computes exactly `trl.GRPOTrainer`'s loss. Each method's config subclasses
    this one with its fields, its part (`method_parts`) and its checks (`check_settings`);
    `trl_entropy.EntropyGRPOConfig` holds every method's fields and trains the methods its `entropy_control` names.

    Parameters:
        entropy_kernel_chunk_size (`int` or `None`, *optional*, defaults to `None`):
            Tokens per chunk of the fused log-prob/entropy kernel. `None` lets the kernel choose from the vocabulary
            size.
        entropy_kernel_backend (`str`, *optional*, defaults to `"auto"`):
            `"auto"` (Triton on CUDA, PyTorch elsewhere), `"torch"` or `"triton"`.
        entropy_control_fresh_start (`bool`, *optional*, defaults to `False`):
            Resume from another method's checkpoint with this method's controllers started fresh (refused otherwise).
        entropy_coef_schedule (`str`, *optional*, defaults to `"constant"`):
            TRL's `entropy_coef` over training: `"constant"`, `"linear"` or `"cosine"` to `entropy_coef_final`, after
            `entropy_coef_warmup_steps` from `entropy_coef_warmup_start`, over `entropy_coef_decay_steps` (`None`:
            to the last step), on the clock `entropy_schedule_unit` (docs/schedules.md).
        entropy_control (`list[str]` or `None`, *optional*, defaults to `None`):
            Methods to combine, by the names `--method` lists (`trl_entropy.EntropyGRPOConfig`; a method's own config
            takes `None` or its own name). `None`: no entropy control.
    """

    # Every loss type of trl.GRPOTrainer (docs/loss_types.md); a method that supports fewer says why in
    # `unsupported_loss_type_reasons` (loss type -> reason), which the refusal quotes.
    supported_loss_types: ClassVar[tuple[str, ...]] = LOSS_TYPES
    unsupported_loss_type_reasons: ClassVar[dict[str, str]] = {}
    # True where the method moves the clip range itself (and warns about on-policy training in its own words).
    controls_clip_range: ClassVar[bool] = False
    # True where `entropy_control` selects TRL's entropy bonus next to other methods.
    selects_trl_entropy_bonus: ClassVar[bool] = False
    # The methods' parts (core/parts.py), one per method in the order of the axes they act on: what the trainer runs.
    method_parts: ClassVar[tuple[type, ...]] = ()
    # Methods combined: (name, paper, tag) of each method the trainer's model card names; None: the trainer's own card.
    model_card: ClassVar[list | None] = None

    entropy_kernel_chunk_size: int | None = config_field(
        None,
        "Tokens per chunk of the fused log-prob/entropy kernel. None lets the kernel choose from the vocabulary size; "
        "smaller values lower the peak memory.",
        valid=Range(1, integer=True),
        none_means="(the kernel chooses from the vocabulary size)",
    )
    entropy_kernel_backend: str = config_field(
        "auto",
        "Backend of the fused log-prob/entropy kernel: 'auto' (Triton on CUDA, PyTorch elsewhere), 'torch' or "
        "'triton'.",
        choices=KERNEL_BACKENDS,
    )
    entropy_control_fresh_start: bool = config_field(
        False,
        "Resume from a checkpoint written by another method (or without entropy-control state): take its weights, "
        "optimizer and progress, and start this method's controllers and a new generation cycle fresh. Off by "
        "default: such a resume is refused. See docs/distributed.md (Resuming).",
    )
    entropy_coef_schedule: str = config_field(
        "constant",
        "Schedule of TRL's entropy coefficient entropy_coef over training: 'constant', 'linear' or 'cosine', from "
        "entropy_coef to entropy_coef_final (reached after the last step), after entropy_coef_warmup_steps. See "
        "docs/schedules.md.",
        choices=SCHEDULES,
    )
    entropy_coef_final: float | None = config_field(
        None,
        "Final entropy coefficient c_1 of a 'linear' or 'cosine' entropy_coef_schedule.",
        valid=Range(),
        none_means="(a constant schedule needs none)",
    )
    entropy_coef_warmup_steps: int = config_field(
        0,
        "Steps (or cycles, see entropy_schedule_unit) over which the entropy coefficient rises linearly from "
        "entropy_coef_warmup_start to entropy_coef; 0: no warm-up.",
        valid=Range(0, integer=True),
    )
    entropy_coef_warmup_start: float = config_field(
        0.0, "Entropy coefficient c_w at the start of the warm-up (entropy_coef_warmup_steps).", valid=Range()
    )
    entropy_coef_decay_steps: int | None = config_field(
        None,
        "Steps (or cycles) from the end of the warm-up to entropy_coef_final.",
        valid=Range(1, integer=True),
        none_means="(to the run's last step, max_steps)",
    )
    entropy_schedule_unit: str = config_field(
        "optimizer_step",
        "The clock of entropy_coef_schedule: 'optimizer_step' (TRL's global_step, as transformers' learning-rate "
        "schedules) or 'generation_cycle' (frozen within a cycle; its warm-up and decay steps count cycles).",
        choices=SCHEDULE_UNITS,
    )
    entropy_control: list[str] | None = config_field(
        None,
        "Methods to combine, by the names --method lists (YAML: `entropy_control: [NAME, NAME]`; command line: "
        "`--method NAME+NAME`). Each acts on its own axis of the loss step, and the config takes every selected "
        "method's fields. None: no entropy control. See docs/composing.md.",
    )

    def __post_init__(self):
        # Checked before TRL's own checks, so that the error names the field and the value given.
        validate_fields(self)
        self.select_methods()
        validate_eval_batch(self)
        super().__post_init__()
        self.check_method_settings()
        epsilon_high = self.epsilon if self.epsilon_high is None else self.epsilon_high  # None means epsilon
        if (self.epsilon, epsilon_high) != (0.2, 0.2) and not self.controls_clip_range:
            # The clip-low recipe (Park et al., arXiv:2509.26114) acts through the clip, which on-policy never binds.
            warn_if_on_policy(
                self,
                f"epsilon={self.epsilon}, epsilon_high={epsilon_high}",
                "every ratio is 1, so the clip never binds and the clip range has no effect.",
                "it to act",
            )

    def check_settings(self) -> None:
        """The entropy coefficient's schedule: a final value where it decays, and no adaptive coefficient beside it."""
        ENTROPY_COEF_SCHEDULE.check(self)
        if self.entropy_schedule().moves and self.use_adaptive_entropy:
            raise ValueError(
                f"entropy_coef_schedule={self.entropy_coef_schedule!r} (entropy_coef_warmup_steps="
                f"{self.entropy_coef_warmup_steps}) and use_adaptive_entropy=True both set the entropy coefficient: "
                "with use_adaptive_entropy it is a controller's state. Choose one of them."
            )

    def entropy_schedule(self) -> Schedule:
        """The schedule of TRL's entropy coefficient, from ``entropy_coef``."""
        return ENTROPY_COEF_SCHEDULE.schedule(self)

    def reads_max_steps(self) -> bool:
        """Whether a value of the run follows its length, ``max_steps`` (a schedule that runs to the last step): a
        checkpoint then records ``max_steps``, and a resume with another one is named. A method config whose values
        follow it extends this, calling ``EntropyGRPOBaseConfig.reads_max_steps(self)`` (the config of several
        methods asks each selected method's config class, with itself as ``self``)."""
        return self.entropy_schedule().moves

    def select_methods(self) -> None:
        """Check ``entropy_control`` against the methods this config trains: a method's own config takes ``None`` or
        the keys of its parts (the config of several methods, ``trl_entropy.EntropyGRPOConfig``, resolves them)."""
        own = [part.key for part in self.method_parts]
        names = self.entropy_control
        if names is not None and (not own or not isinstance(names, (list, tuple)) or list(names) != own):
            raise ValueError(
                f"entropy_control={self.entropy_control!r} does not match {type(self).__name__}, the config of other "
                f"methods ({own or 'none'}): build trl_entropy.EntropyGRPOConfig(entropy_control=...) with the "
                "methods you want."
            )

    def library_class(self) -> type:
        """The library config this one is (a user's subclass counts as the library config it extends)."""
        return next(c for c in type(self).__mro__ if c.__module__.startswith("trl_entropy."))

    def method_configs(self) -> list[tuple[str, type]]:
        """``(name, config class)`` of each method this config trains, as its messages name it."""
        library = self.library_class()
        return [(library.__name__.removesuffix("BaseConfig").removesuffix("Config"), library)]

    def check_method_settings(self) -> None:
        """Refuse settings the methods cannot train with: a ``loss_type`` one does not support, quoting its reason;
        then each method config's own ``check_settings`` (those of the classes it extends first), once each."""
        checks = []
        for name, config_class in self.method_configs():
            refuse_loss_type(self.loss_type, name, config_class)
            for owner in reversed(config_class.__mro__):
                if "check_settings" in vars(owner) and owner not in checks:
                    checks.append(owner)
        for owner in checks:
            owner.check_settings(self)

    @property
    def method_label(self) -> str:
        """The name a checkpoint records for the methods this config trains: their trainer class's."""
        library = self.library_class()
        if library is EntropyGRPOBaseConfig:
            return "EntropyGRPOTrainer"
        return library.__name__.replace("Config", "Trainer")

    @classmethod
    def from_grpo_config(cls, grpo_config: GRPOConfig):
        """This config built from a plain `GRPOConfig`: every field the user changed from `GRPOConfig`'s defaults keeps
        its value; every other field, the method's own included, takes this config's default."""
        # A GRPOConfig's fields hold values derived in __post_init__ (steps_per_generation, bf16, scale_rewards...). A
        # GRPOConfig built from the defaults derives the same values, so comparing with one finds what was changed.
        # The precision and device are carried over as they are: the defaults may not even be valid on this machine.
        kept = {name: getattr(grpo_config, name) for name in ("output_dir", "use_cpu", "bf16", "fp16")}
        reference = GRPOConfig(**kept)
        changed = {
            f.name: getattr(grpo_config, f.name)
            for f in fields(GRPOConfig)
            # generation_batch_size follows from steps_per_generation; passing both is an error in GRPOConfig.
            if f.init
            and f.name != "generation_batch_size"
            and getattr(grpo_config, f.name) != getattr(reference, f.name)
        }
        return cls(**kept, **changed)

    @classmethod
    def coerce(cls, args, trainer_name: str, model=None):
        """``args`` as this config for ``trainer_name``: a plain ``GRPOConfig`` is converted (see
        :meth:`from_grpo_config`), with one log line; anything but this config is refused. ``None`` gives this
        config's defaults with the output directory named as TRL names it, after the model (its name or its
        config's ``_name_or_path``, last path part), then the trainer: ``"<model>-<trainer without 'Trainer'>"``."""
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            return cls(f"{model_name.split('/')[-1]}-{trainer_name.removesuffix('Trainer')}")
        if isinstance(args, GRPOConfig) and not isinstance(args, EntropyGRPOBaseConfig):
            args = cls.from_grpo_config(args)
            logger.warning(
                f"{trainer_name}: built a {cls.__name__} from the GRPOConfig given as `args`; fields left at "
                f"GRPOConfig's defaults, and {cls.__name__}'s own fields, take {cls.__name__}'s defaults."
            )
        combined = isinstance(args, EntropyGRPOBaseConfig) and args.entropy_control is not None  # parts checked later
        if not isinstance(args, cls) and not combined:
            raise TypeError(
                f"{trainer_name} needs `args` of type {cls.__name__} (or a plain GRPOConfig), "
                f"got {type(args).__name__}."
            )
        return args
