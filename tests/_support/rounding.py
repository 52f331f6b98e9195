"""Comparisons of two runs that agree up to fp32 rounding: two processes against one, one micro-batch against two
halves. Each bound is a :class:`Bound` in the test beside its comparison (below, where two tests share it), derived
from a measurement:

* the largest difference fp32 summation order alone produced, on each CPU numeric path this suite was run on
  (``ATEN_CPU_CAPABILITY=default``, ``avx2``, ``avx512``), times a stated margin;
* and, in the same comment, the difference a planted bug produces (a rank-local statistic, a doubled normaliser), which
  the bound must stay far below.

Where a controller integrates a statistic over its updates, the statistic it received at each update is compared with
its own bound, and the controller's value after ``k`` updates with a bound ``k`` times a per-update one
(:meth:`Bound.after`): rounding in each update's statistic adds up in the value, once per update.

To measure again, run the tests with ``TRL_ENTROPY_ROUNDING_LOG=FILE``: every comparison made through :func:`check`
appends its largest differences and the share of its bound they take to ``FILE`` (one JSON line each, with the
numeric path);
``python tests/_support/rounding.py [--by-kind] FILE...`` prints the largest per comparison and path. The log only
records; it changes no result.
"""

import json
import math
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import torch


LOG_VARIABLE = "TRL_ENTROPY_ROUNDING_LOG"


@dataclass(frozen=True)
class Bound:
    """``|actual − expected| <= max(rel · |expected|, abs)`` element by element (``pytest.approx``'s rule)."""

    rel: float
    abs: float = 0.0

    def after(self, updates: int) -> "Bound":
        """This per-update bound, summed over ``updates`` updates."""
        return Bound(self.rel * updates, self.abs * updates)


@dataclass(frozen=True)
class ControllerBounds:
    """A run's controllers: the bound of the statistic each update receives, and the per-update bounds of the values
    of the controllers moved once per generation cycle and of those their method moves at every micro-batch."""

    statistic: Bound
    cycle: Bound
    moved_by_method: Bound


# Two processes against one with the same global batch: the text-only toy under DDP, ZeRO-3 and FSDP2
# (tests/launch/test_distributed.py) and a tiny Qwen2-VL under DDP (tests/launch/test_vlm_distributed.py). Two ranks
# sum in another order than one process; Adam's normalised first steps carry that rounding into the weights, and the
# later steps' statistics and losses come from those weights. Each bound below: the largest difference over those runs
# on ATEN_CPU_CAPABILITY=default, avx2 and avx512 (one AMD EPYC), the margin, and what the planted bugs produce: a
# rank-local controller statistic (no all-reduce), and a doubled normaliser (the token-sum loss types' normaliser not
# divided by the process count).
TWO_PROCESS_CONTROLLERS = ControllerBounds(
    # The entropy each update receives: toy 6.4e-7 relative (about 5 ulps), margin 4.7; the rank-local statistic
    # 0.089-0.38, the doubled normaliser 1.8e-4 from the second update on (the first sees the same weights). VLM
    # 2.0e-7, margin 15; rank-local 4.4e-4 to 1.6e-3, the doubled normaliser 2.4e-4 at the third update.
    statistic=Bound(rel=3e-6),
    # Values moved once per cycle with a small gain (AEnt's λ, REPO's β, ADAPO's ε_high): toy 2.8e-8 relative per
    # update, margin 11; the doubled normaliser 1.7e-5 per update (AEnt under ZeRO-3 and FSDP2), rank-local 0.035-1.
    # VLM 5.4e-8, margin 5.6; the doubled normaliser 6.2e-5 (AEnt's λ).
    cycle=Bound(rel=3e-7, abs=1e-9),
    # A value its method moves at every micro-batch follows its statistic one for one (EntroPIC's α, K_p = 1), so its
    # error is the statistic's in nats, whatever the value's size (α ≈ 0.09 on the toy, so 3.4e-6 relative was seen on
    # an Intel Xeon for 3.2e-7 absolute): 5.3e-8 per update, margin 19; the doubled normaliser 2.3e-3, rank-local 0.30.
    # On the VLM α sits at its bound of 1 (the random VLM's entropy is far above the target): 0 difference.
    moved_by_method=Bound(rel=0, abs=1e-6),
)
# The logged entropy: toy 6.3e-7 relative, margin 16; the doubled normaliser 6.7e-3, rank-local 4.3e-2. VLM 2.1e-7,
# margin 47; the doubled normaliser 2.4e-4.
TWO_PROCESS_ENTROPY = Bound(rel=1e-5)
# The logged loss: toy 9.8e-6 relative (3.2e-5 absolute), margin 10; VLM 2.7e-7, margin 360; the doubled normaliser
# halves it (0.5).
TWO_PROCESS_LOSS = Bound(rel=1e-4, abs=1e-6)
# The weights after three Adam steps at lr 1e-3, by model. Toy 3.1e-5, margin 3.2; an unreduced LM-head gradient (each
# rank keeping its own half's) 4e-3, rank-local 3.9e-3, the doubled normaliser 3.8e-3 under DDP (Adam is blind to the
# gradient's scale: under ZeRO-3 and FSDP2 the doubled normaliser moves the weights 1.8e-5, and the loss catches it).
# VLM 5.6e-7, margin 18; the doubled normaliser 5.8e-4.
TWO_PROCESS_WEIGHTS = {"toy": Bound(rel=0, abs=1e-4), "vlm": Bound(rel=0, abs=1e-5)}


def flat(values) -> list[float]:
    """Numbers, tuples, nested lists or tensors as one flat list of floats."""
    if isinstance(values, torch.Tensor):
        return values.detach().double().flatten().tolist()
    if isinstance(values, Iterable) and not isinstance(values, str):
        return [number for value in values for number in flat(value)]
    return [float(values)]


def differences(actual, expected) -> tuple[float, float]:
    """``(largest |a − e|, largest |a − e| / |e|)``, the second over the elements with ``e ≠ 0``."""
    first, second = flat(actual), flat(expected)
    assert len(first) == len(second), f"{len(first)} values against {len(second)}"
    absolute = [abs(a - e) for a, e in zip(first, second, strict=True)]
    relative = [d / abs(e) for d, e in zip(absolute, second, strict=True) if e != 0]
    return max(absolute, default=0.0), max(relative, default=0.0)


def numeric_path() -> str:
    """The CPU numeric path this process runs: ``ATEN_CPU_CAPABILITY`` if set, else what ATen picked."""
    return os.environ.get("ATEN_CPU_CAPABILITY") or torch.backends.cpu.get_cpu_capability().lower()


def used(actual, expected, bound: Bound) -> float:
    """The largest share of ``bound`` any element's difference takes (above 1: the check fails)."""
    shares = [
        abs(a - e) / max(bound.rel * abs(e), bound.abs, sys.float_info.min)
        for a, e in zip(flat(actual), flat(expected), strict=True)
    ]
    return max(shares, default=0.0)


def record(quantity: str, actual, expected, bound: Bound) -> None:
    """Append the comparison's largest differences, and the share of ``bound`` they take, to the log, if one is asked
    for."""
    log = os.environ.get(LOG_VARIABLE)
    if not log:
        return
    largest_abs, largest_rel = differences(actual, expected)
    entry = {
        "quantity": quantity,
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
        "path": numeric_path(),
        "abs": largest_abs,
        "rel": largest_rel,
        "used": used(actual, expected, bound),
    }
    with open(log, "a") as file:
        file.write(json.dumps(entry) + "\n")


def check(quantity: str, actual, expected, bound: Bound) -> None:
    """Assert that ``actual`` is ``expected`` within ``bound``, element by element; ``quantity`` names the comparison
    in the log and in the failure."""
    record(quantity, actual, expected, bound)
    first, second = flat(actual), flat(expected)
    assert len(first) == len(second), f"{quantity}: {len(first)} values against {len(second)}"
    for index, (a, e) in enumerate(zip(first, second, strict=True)):
        allowed = max(bound.rel * abs(e), bound.abs)
        assert math.isfinite(a) and abs(a - e) <= allowed, (
            f"{quantity}[{index}]: {a!r} against {e!r}, |difference| {abs(a - e):.3g} > {allowed:.3g} ({bound})"
        )


def check_per_update(quantity: str, actual_steps, expected_steps, per_update: Bound) -> None:
    """A value integrated over updates, one entry per update: the ``k``-th within ``per_update.after(k)``."""
    assert len(actual_steps) == len(expected_steps), f"{quantity}: {len(actual_steps)} updates against " + str(
        len(expected_steps)
    )
    for index, (actual, expected) in enumerate(zip(actual_steps, expected_steps, strict=True)):
        check(f"{quantity} after update {index + 1}", actual, expected, per_update.after(index + 1))


def summary(lines: Iterable[str], by_kind: bool = False) -> dict[tuple[str, str], tuple[float, float, float]]:
    """``{(quantity, path): (largest abs, largest rel, largest share of the bound)}`` over the log's lines; a
    quantity's per-update entries are folded into one (``after update k`` dropped, the differences divided by ``k``,
    as the bound grows). ``by_kind`` folds the cases too (the ``[...]`` part of a quantity: the method, the loss
    type)."""
    table: dict[tuple[str, str], tuple[float, float, float]] = {}
    for line in lines:
        entry = json.loads(line)
        quantity, updates = entry["quantity"], 1
        if " after update " in quantity:
            quantity, count = quantity.split(" after update ")
            quantity, updates = f"{quantity} (per update)", int(count)
        if by_kind:
            quantity = re.sub(r"\[[^\]]*\]", "", quantity)
        key = (quantity, entry["path"])
        largest = table.get(key, (0.0, 0.0, 0.0))
        table[key] = (
            max(largest[0], entry["abs"] / updates),
            max(largest[1], entry["rel"] / updates),
            max(largest[2], entry["used"]),
        )
    return table


def main(arguments: list[str]) -> None:
    by_kind = "--by-kind" in arguments
    paths = [argument for argument in arguments if argument != "--by-kind"]
    lines = [line for path in paths for line in open(path) if line.strip()]
    table = summary(lines, by_kind)
    width = max((len(quantity) for quantity, _ in table), default=8)
    print(f"{'comparison':<{width}}  {'path':<8}  {'largest abs':>11}  {'largest rel':>11}  {'of bound':>8}")
    for (quantity, path), (largest_abs, largest_rel, share) in sorted(table.items()):
        print(f"{quantity:<{width}}  {path:<8}  {largest_abs:11.3g}  {largest_rel:11.3g}  {share:8.3g}")


if __name__ == "__main__":
    main(sys.argv[1:])
