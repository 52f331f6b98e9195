"""The integer check the evaluation functions share."""

import math
import numbers

import numpy as np


def as_count(value, name: str) -> int:
    """``value`` as an int; a bool, a non-number or a number with a fractional part is a ValueError naming it."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if not math.isfinite(value) or value != int(value):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return int(value)
