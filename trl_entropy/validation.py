"""Validation helpers shared by the methods' configs."""

import math


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
