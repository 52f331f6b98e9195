"""Intervals over seeds and held-out problems: a two-level (hierarchical) percentile bootstrap.

A method's score is a table ``values[seed, problem]`` (pass@k of one held-out problem in the run of one seed) or a
vector ``values[seed]`` (a number per run: the final entropy, a reward gain). One bootstrap resample draws as many
seeds as there are, with replacement, and within each drawn seed as many problems as there are, with replacement;
its statistic is the mean of what was drawn. The interval is the percentile interval of those resampled means.

The difference between two methods is bootstrapped paired: the same seeds and problems are drawn for both, which is
the bootstrap of their difference table ``values − baseline``. Every call draws from a generator seeded with
``seed``, so the same input gives the same interval, and two methods of equal shape are resampled with the same
indices.

With few seeds the percentile interval over seeds is narrower than it should be (with 5 seeds its coverage of a
normal mean is about 0.86, not 0.95, measured): read it as a lower bound on the spread, not a test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


__all__ = ["Interval", "bootstrap_difference", "bootstrap_mean", "resampled_means"]


@dataclass(frozen=True)
class Interval:
    """The mean of the values and the ``confidence`` percentile interval ``[low, high]`` of its bootstrap."""

    mean: float
    low: float
    high: float
    confidence: float

    def excludes_zero(self) -> bool:
        """Whether the interval lies wholly above or wholly below 0 (a difference that holds at this confidence)."""
        return self.low > 0 or self.high < 0


def _as_table(values, name: str) -> np.ndarray:
    table = np.asarray(values, dtype=np.float64)
    if table.ndim == 1:
        table = table[:, None]
    if table.ndim != 2 or table.shape[0] < 1 or table.shape[1] < 1:
        raise ValueError(
            f"{name} must be a non-empty vector (one value per seed) or table (seeds × problems), got shape "
            f"{np.shape(values)}"
        )
    if not np.isfinite(table).all():
        raise ValueError(
            f"{name} must hold finite numbers only; found {int((~np.isfinite(table)).sum())} that are not"
        )
    return table


def resampled_means(values, num_resamples: int = 10_000, seed: int = 0) -> np.ndarray:
    """The means of ``num_resamples`` two-level bootstrap resamples of ``values`` (shape ``(seeds,)`` or
    ``(seeds, problems)``): seeds drawn with replacement, then, within each drawn seed, problems drawn with
    replacement. Deterministic for a given ``seed``."""
    table = _as_table(values, "values")
    if not (isinstance(num_resamples, int) and num_resamples >= 1):
        raise ValueError(f"num_resamples must be a positive integer, got {num_resamples!r}")
    num_seeds, num_problems = table.shape
    generator = np.random.default_rng(seed)
    seeds = generator.integers(0, num_seeds, size=(num_resamples, num_seeds))
    problems = generator.integers(0, num_problems, size=(num_resamples, num_seeds, num_problems))
    return table[seeds[:, :, None], problems].mean(axis=(1, 2))


def bootstrap_mean(values, *, confidence: float = 0.95, num_resamples: int = 10_000, seed: int = 0) -> Interval:
    """The mean of ``values`` (shape ``(seeds,)`` or ``(seeds, problems)``) and its ``confidence`` percentile
    interval under :func:`resampled_means`."""
    if not (isinstance(confidence, (int, float)) and 0 < confidence < 1 and math.isfinite(confidence)):
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence!r}")
    table = _as_table(values, "values")
    means = resampled_means(table, num_resamples, seed)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return Interval(float(table.mean()), float(low), float(high), float(confidence))


def bootstrap_difference(
    values, baseline, *, confidence: float = 0.95, num_resamples: int = 10_000, seed: int = 0
) -> Interval:
    """``mean(values) − mean(baseline)`` and its paired interval: the same seeds and problems resampled for both
    (both of one shape, their rows the same seeds and their columns the same problems)."""
    table, reference = _as_table(values, "values"), _as_table(baseline, "baseline")
    if table.shape != reference.shape:
        raise ValueError(
            f"values and baseline must have one shape (the same seeds and problems, paired), got {table.shape} and "
            f"{reference.shape}"
        )
    return bootstrap_mean(table - reference, confidence=confidence, num_resamples=num_resamples, seed=seed)
