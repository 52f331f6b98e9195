"""Validation helpers shared by the methods' configs."""

import math
import warnings


def is_finite_number(value) -> bool:
    """True for a finite int or float (bools, NaN and infinities excluded)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


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
