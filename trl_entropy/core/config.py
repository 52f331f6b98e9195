"""``EntropyGRPOConfig``, the base of every method's config, and the validators the methods' configs share."""

import math
import warnings
from dataclasses import dataclass, field, fields
from typing import ClassVar

from transformers.utils import logging
from trl import GRPOConfig
from trl.trainer.utils import get_config_model_id

from .objectives import LOSS_TYPES


KERNEL_BACKENDS = ("auto", "torch", "triton")
logger = logging.get_logger(__name__)


def is_finite_number(value) -> bool:
    """True for a finite int or float (bools, NaN and infinities excluded)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_integer(value) -> bool:
    """True for an int (bools excluded)."""
    return isinstance(value, int) and not isinstance(value, bool)


def reject_trl_entropy_bonus(config, method: str) -> None:
    """Refuse TRL's own entropy bonus next to a method that controls entropy itself.

    Two entropy controls at once are almost certainly a mistake.
    """
    if config.entropy_coef != 0.0 or config.use_adaptive_entropy:
        raise ValueError(
            f"{method} controls entropy itself; TRL's entropy bonus on top of it would be a second entropy bonus: got "
            f"entropy_coef={config.entropy_coef!r} and use_adaptive_entropy={config.use_adaptive_entropy!r}. "
            "Set entropy_coef=0.0 and use_adaptive_entropy=False."
        )


def warn_if_on_policy(config, subject: str, consequence: str, acts: str, stacklevel: int) -> None:
    """Warn once, naming the settings that would make ``subject`` act, when training is fully on-policy: every
    generation batch serves a single optimizer step, so every importance ratio is 1 (``ℓ^old = ℓ``).

    ``consequence`` says what that does to the method, ``acts`` completes "Set ... for {acts}." ``stacklevel`` is the
    caller's, as for ``warnings.warn``.
    """
    generate_every = config.steps_per_generation * config.num_iterations
    if config.gradient_accumulation_steps % generate_every == 0:
        warnings.warn(
            f"{subject} with fully on-policy updates (gradient_accumulation_steps is a multiple of "
            f"steps_per_generation * num_iterations = {generate_every}): {consequence} Set num_iterations > 1 or "
            f"steps_per_generation > gradient_accumulation_steps for {acts}.",
            stacklevel=stacklevel + 1,
        )


def validate_entropy_target(name: str, value) -> None:
    """A method's entropy target: a positive finite number of nats, or None (measured on the first cycle)."""
    if value is not None and not (is_finite_number(value) and value > 0):
        raise ValueError(
            f"{name} must be a positive finite number of nats, or None to measure it on the first generation cycle; "
            f"got {value!r}."
        )


def validate_fraction(name: str, value) -> None:
    """A fraction of the valid tokens: a number in (0, 1]."""
    if not (is_finite_number(value) and 0 < value <= 1):
        raise ValueError(f"{name}={value!r} is invalid: it must be in (0, 1] (a fraction of the valid tokens).")


def validate_grpo_values(config) -> None:
    """Values of TRL's own fields that TRL accepts (or rejects quoting another number) but that cannot train: checked
    here first, so the error names the field and the value given. Some of these checks are stricter than TRL's."""
    stricter = "(stricter than trl.GRPOConfig, which accepts it and then fails or trains nothing)"
    iterations = config.num_iterations
    if not (is_integer(iterations) and iterations >= 1):
        raise ValueError(f"num_iterations={iterations!r} is invalid: it must be an integer >= 1 {stricter}.")
    for name in ("epsilon", "epsilon_high", "beta"):
        value = getattr(config, name)
        if name == "epsilon_high" and value is None:  # None: epsilon_high = epsilon
            continue
        if not (is_finite_number(value) and value >= 0):
            raise ValueError(f"{name}={value!r} is invalid: it must be a finite number >= 0 {stricter}.")
    quantile = config.top_entropy_quantile
    if not (is_finite_number(quantile) and 0 <= quantile <= 1):
        raise ValueError(f"top_entropy_quantile={quantile!r} is invalid: it must be in [0, 1].")
    generations = config.num_generations_eval or config.num_generations
    evaluates = config.eval_strategy not in ("no", None) or config.do_eval
    eval_batch = config.per_device_eval_batch_size
    if evaluates and isinstance(generations, int) and generations > 0 and eval_batch % generations:
        raise ValueError(
            f"per_device_eval_batch_size={eval_batch!r} is invalid: it must be a multiple of num_generations_eval "
            f"(or num_generations) = {generations}, so that every evaluation batch holds whole groups {stricter}."
        )


@dataclass
class EntropyGRPOConfig(GRPOConfig):
    r"""
    Configuration for [`EntropyGRPOTrainer`]: every field of [`~trl.GRPOConfig`] plus the entropy kernel's settings.

    With no entropy control switched on, the trainer computes exactly `trl.GRPOTrainer`'s loss. The methods'
    configs (`AEntConfig`, `ClipCovConfig`, ...) subclass this one.

    Parameters:
        entropy_kernel_chunk_size (`int` or `None`, *optional*, defaults to `None`):
            Tokens per chunk of the fused log-prob/entropy kernel. `None` lets the kernel choose from the vocabulary
            size.
        entropy_kernel_backend (`str`, *optional*, defaults to `"auto"`):
            `"auto"` (Triton on CUDA, PyTorch elsewhere), `"torch"` or `"triton"`.
        entropy_control_fresh_start (`bool`, *optional*, defaults to `False`):
            Resume from another method's checkpoint with this method's controllers started fresh (refused otherwise).
    """

    # Every loss type of trl.GRPOTrainer (docs/loss_types.md); a method that supports fewer says why in
    # `unsupported_loss_type_reasons` (loss type -> reason), which the refusal quotes.
    supported_loss_types: ClassVar[tuple[str, ...]] = LOSS_TYPES
    unsupported_loss_type_reasons: ClassVar[dict[str, str]] = {}
    # True where the method moves the clip range itself (and warns about on-policy training in its own words).
    controls_clip_range: ClassVar[bool] = False

    entropy_kernel_chunk_size: int | None = field(
        default=None,
        metadata={
            "help": "Tokens per chunk of the fused log-prob/entropy kernel. None lets the kernel choose from the "
            "vocabulary size; smaller values lower the peak memory."
        },
    )
    entropy_kernel_backend: str = field(
        default="auto",
        metadata={
            "help": "Backend of the fused log-prob/entropy kernel: 'auto' (Triton on CUDA, PyTorch elsewhere), "
            "'torch' or 'triton'.",
            "choices": list(KERNEL_BACKENDS),
        },
    )
    entropy_control_fresh_start: bool = field(
        default=False,
        metadata={
            "help": "Resume from a checkpoint written by another method (or without entropy-control state): take its "
            "weights, optimizer and progress, and start this method's controllers and a new generation cycle fresh. "
            "Off by default: such a resume is refused. See docs/distributed.md (Resuming)."
        },
    )

    def __post_init__(self):
        validate_grpo_values(self)
        super().__post_init__()
        if self.loss_type not in self.supported_loss_types:
            method = type(self).__name__.removesuffix("Config")
            reason = self.unsupported_loss_type_reasons.get(self.loss_type)
            reason = f": {reason}" if reason else ""
            raise ValueError(
                f"{method} does not support loss_type={self.loss_type!r}{reason}; "
                f"choose one of {list(self.supported_loss_types)}."
            )
        if not isinstance(self.entropy_control_fresh_start, bool):
            raise ValueError(f"entropy_control_fresh_start must be a bool, got {self.entropy_control_fresh_start!r}.")
        if self.entropy_kernel_backend not in KERNEL_BACKENDS:
            raise ValueError(
                f"entropy_kernel_backend={self.entropy_kernel_backend!r} is not one of {list(KERNEL_BACKENDS)}."
            )
        chunk_size = self.entropy_kernel_chunk_size
        if chunk_size is not None and not (is_integer(chunk_size) and chunk_size > 0):
            raise ValueError(f"entropy_kernel_chunk_size must be a positive integer or None, got {chunk_size!r}.")
        epsilon_high = self.epsilon if self.epsilon_high is None else self.epsilon_high  # None means epsilon
        if (self.epsilon, epsilon_high) != (0.2, 0.2) and not self.controls_clip_range:
            # The clip-low recipe (Park et al., arXiv:2509.26114) acts through the clip, which on-policy never binds.
            warn_if_on_policy(
                self,
                f"epsilon={self.epsilon}, epsilon_high={epsilon_high}",
                "every ratio is 1, so the clip never binds and the clip range has no effect.",
                "it to act",
                stacklevel=3,
            )

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
        if isinstance(args, GRPOConfig) and not isinstance(args, EntropyGRPOConfig):
            args = cls.from_grpo_config(args)
            logger.warning(
                f"{trainer_name}: built a {cls.__name__} from the GRPOConfig given as `args`; fields left at "
                f"GRPOConfig's defaults, and {cls.__name__}'s own fields, take {cls.__name__}'s defaults."
            )
        if not isinstance(args, cls):
            raise TypeError(
                f"{trainer_name} needs `args` of type {cls.__name__} (or a plain GRPOConfig), "
                f"got {type(args).__name__}."
            )
        return args
