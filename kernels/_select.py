"""Row-wise k-th smallest logit (the clamp threshold) without sorting the row, and without a host synchronisation
per pass.

The clamped entropy drops, in every row, the entries ``<=`` the row's k-th smallest logit ``z_(k)``. All it needs
from a row is a threshold ``t`` with ``z <= t`` selecting exactly those entries: ``z_(k)`` itself, or any value in
``[z_(k), z_(k+1))``. Sorting or ``topk`` of a 150k-wide row is far more work than that, and ``torch.kthvalue`` on
the CPU (it copies every row with its indices and quick-selects it) costs ~15-18 ns per logit, close to the chunk's
own matmul at d = 512. This module finds the threshold by a **counting search on the value**: each pass is one
compare and one row sum over the chunk (``count(z <= t)``).

1. A strided sample of each row (``_SAMPLE`` columns) gives two guesses on both sides of the target rank (two of
   its order statistics, by ``topk``: a sort of the sample cost more than a pass at V = 32k), counted in the first
   pass: most rows start with a verified bracket ``count(<= lo) <= k < count(<= hi)`` a few
   thousand entries wide (at V = 152k).
2. Each further pass interpolates the counts inside the bracket towards rank ``k + 1/2`` (regula falsi with the
   Illinois modification; the midpoint when the guess is not strictly inside). A guess that counts exactly ``k``
   becomes ``lo`` and is the answer (later guesses lie above it).
3. The number of passes is fixed (``passes``) and every update is a device-side mask: the loop never reads a value
   back to the host, so a GPU does not stall on it. After the loop one host read per call (how many rows are still
   open, and how many of them have a wide bracket) decides how they end: the ``k - count(<= lo)``-th smallest of
   the few entries inside the bracket, picked exactly from those entries alone (two ``nonzero``), or
   ``torch.kthvalue`` for a row whose bracket is still wide (ties over a large part of the row, a constant row).
   At most four host reads per call, whatever the number of passes.

The passes run by blocks of rows (``block_rows``): on the CPU a block of ``_BLOCK_BYTES_CPU`` bytes of logits, so
that every pass after the first reads the block from cache (~0.4-0.5 instead of ~1 ns per logit for a compare and a
row sum under load), on a GPU the whole chunk.

Rows of fewer than ``2 * _SAMPLE`` entries go to ``torch.kthvalue`` straight away (the sample would be the row).

The result is exact either way: a ``t`` with ``count(<= t) == k``, or the k-th smallest value itself (with ties at
the boundary, every entry equal to it counts as ``<= t``).
"""

from __future__ import annotations

import math

import torch


_SAMPLE = 1024  # strided sample width per row, for the first guesses
_PASSES = 6  # counting passes over the chunk (the first one counts two guesses)
_SPREAD = 2.5  # the first two guesses sit this many standard deviations of the sample quantile apart from the target
_FINISH_MAX = (
    4096  # open brackets with at most this many entries end by a small exact selection, wider ones by kthvalue
)


def kth_smallest_threshold(
    z: torch.Tensor,
    k: int,
    *,
    row_max: torch.Tensor | None = None,
    scratch: torch.Tensor | None = None,
    passes: int | None = None,
    block_rows: int | None = None,
) -> torch.Tensor:
    """Per row of ``z`` (n, V), fp32 without NaN: a threshold ``t`` (n,) such that ``z <= t`` selects exactly the
    entries ``<=`` the k-th smallest value of the row (the ``k`` smallest ones when there is no tie at the boundary).

    ``1 <= k < V``. ``row_max`` may pass ``z.amax(1)`` when the caller already has it. ``scratch`` is an optional fp32
    buffer with at least ``2 * z.numel()`` elements (otherwise one is allocated). ``passes`` >= 1 (default
    ``_PASSES``) is the number of counting passes before the rows still open are finished exactly (any value gives the
    same result). ``block_rows`` (default: the whole chunk on a GPU, a cache-sized block on the CPU) is how many rows
    go through the passes together (any value gives the same result).
    """
    n, vocab = z.shape
    passes = _PASSES if passes is None else passes
    if not 1 <= k < vocab:
        raise ValueError(f"k must be in [1, V), got k={k} with V={vocab}")
    if n == 0:
        return torch.empty(0, dtype=z.dtype, device=z.device)
    stride = vocab // _SAMPLE
    if stride <= 1:  # short rows: the sample would be (nearly) the whole row
        return torch.kthvalue(z, k, dim=1).values
    if scratch is None:
        scratch = torch.empty(2 * z.numel(), dtype=z.dtype, device=z.device)
    target = k + 0.5
    rows = _block_rows(z) if block_rows is None else max(1, int(block_rows))
    row_max = z.amax(1) if row_max is None else row_max
    # the passes run block by block (on the CPU a block of rows that stays in cache: every pass over it reads the
    # cache, not memory); a GPU takes the whole chunk as one block. Nothing here reads the host.
    parts = [
        _search_block(z[r0 : r0 + rows], k, row_max[r0 : r0 + rows], scratch, passes, target)
        for r0 in range(0, n, rows)
    ]
    thr, done, lo, hi, f_lo_true, f_hi_true = (
        parts[0][i] if len(parts) == 1 else torch.cat([part[i] for part in parts]) for i in range(6)
    )

    # The rows still open. One host read: how many end inside their bracket and how many by kthvalue.
    entries = f_hi_true - f_lo_true  # count(<= hi) - count(<= lo)
    small = ~done & (entries <= _FINISH_MAX) & torch.isfinite(lo)
    wide = ~done & ~small
    n_small, n_wide = divmod(int((small.sum() * (n + 1) + wide.sum()).item()), n + 1)
    if n_small > 0:
        rows = small.nonzero().squeeze(1)
        c_lo = (f_lo_true + target).round()
        found = _finish_in_bracket(z, scratch, rows, lo[rows], hi[rows], (k - c_lo)[rows], entries[rows])
        thr = thr.index_copy(0, rows, found)
    if n_wide > 0:
        rows = wide.nonzero().squeeze(1)
        thr = thr.index_copy(0, rows, torch.kthvalue(z.index_select(0, rows), k, dim=1).values)
    return thr


_BLOCK_BYTES_CPU = 8 << 20  # a row block of this many bytes of logits stays in this CPU's cache through the passes


def _block_rows(z: torch.Tensor) -> int:
    """Rows per block for the counting passes: the whole chunk on a GPU, a cache-sized block on the CPU."""
    if z.device.type != "cpu":
        return max(1, z.shape[0])
    return max(1, _BLOCK_BYTES_CPU // (z.element_size() * max(1, z.shape[1])))


def _search_block(z, k, row_max, scratch, passes, target):
    """The counting passes over one block of rows ``z`` (b, V). Returns ``(thr, done, lo, hi, f_lo_true, f_hi_true)``
    per row: ``thr`` is valid where ``done``; elsewhere the verified bracket and its counts minus ``target``."""
    n, vocab = z.shape
    stride = vocab // _SAMPLE
    sample = z[:, ::stride]
    buf = scratch.view(-1)[: z.numel()].view(n, vocab)

    def count(t: torch.Tensor) -> torch.Tensor:
        """``count(z <= t) - target`` per row (fp32 sums of 0/1 are exact below 2**24)."""
        torch.le(z, t.unsqueeze(1), out=buf)
        return buf.sum(1) - target

    # the bracket lo < z_(k) <= hi, with f = count - target (f_lo < 0 < f_hi): first just below the row's minimum (a
    # count of 0, except on a row with -inf entries: there lo = -inf is unverified until a guess lands below the
    # target) and at its maximum (a count of V)
    hi = row_max.clone()
    lo = torch.nextafter(z.amin(1), torch.full_like(hi, -math.inf))
    f_lo = torch.full_like(lo, -target)
    f_hi = torch.full_like(lo, vocab - target)
    f_lo_true, f_hi_true = f_lo.clone(), f_hi.clone()  # the same without the Illinois halving
    side = torch.zeros_like(lo)  # which end moved last: -1 lo, +1 hi

    def update(t, f, guarded=False):
        """Move the end on ``t``'s side to ``t``. A guess that counts exactly ``k`` becomes ``lo`` (``f_lo_true`` is
        then ``-1/2``) and stays a valid threshold: later guesses lie above it. Every row moves one end per pass, so
        this is a few whole-block ops (each op costs the CPU a few microseconds whatever its size)."""
        nonlocal lo, hi, f_lo, f_hi, f_lo_true, f_hi_true, side
        below = f < 0
        above = ~below
        if guarded:  # pass 1: the guesses need not lie inside the bracket
            below = below & (t > lo)
            above = above & (t < hi)
        f_hi = torch.where(below & (side < 0), 0.5 * f_hi, f_hi)
        f_lo = torch.where(above & (side > 0), 0.5 * f_lo, f_lo)
        lo, f_lo, f_lo_true = (torch.where(below, new, old) for new, old in ((t, lo), (f, f_lo), (f, f_lo_true)))
        hi, f_hi, f_hi_true = (torch.where(above, new, old) for new, old in ((t, hi), (f, f_hi), (f, f_hi_true)))
        side = torch.where(below, -1.0, torch.where(above, 1.0, side)) if guarded else below * -2.0 + 1.0

    # pass 1: two guesses from the sorted sample, on both sides of the target rank
    width = sample.shape[1]
    q = target / vocab
    spread = _SPREAD * math.sqrt(q * (1 - q) / width) + 1.0 / width
    pos1, pos2 = (min(max(int(round(u * width - 0.5)), 0), width - 1) for u in (q - spread, q + spread))
    # the sample's order statistics at pos1 <= pos2 without sorting it (a sort of the sample, with its indices, cost
    # more than a counting pass at V = 32k): the max of its pos2 + 1 smallest, and the min of the pos2 - pos1 + 1
    # largest of those
    smallest = sample.topk(pos2 + 1, 1, largest=False, sorted=False).values
    for t in (smallest.topk(pos2 - pos1 + 1, 1, sorted=False).values.amin(1), smallest.amax(1)):
        update(t, count(t), guarded=True)
    # further passes: regula falsi inside the bracket (the midpoint when the guess is not strictly inside)
    for _ in range(passes - 1):
        t = lo - f_lo * ((hi - lo) / (f_hi - f_lo))
        t = torch.where((t > lo) & (t < hi), t, 0.5 * lo + 0.5 * hi)
        update(t, count(t))
    done = f_lo_true > -1  # count(<= lo) == k
    return lo, done, lo, hi, f_lo_true, f_hi_true


def _finish_in_bracket(z, scratch, rows, lo, hi, rank, entries):
    """For each of ``rows``: the ``rank``-th smallest of its ``entries`` entries ``lo < z <= hi``, by a sort of just
    those entries. The rows are copied into ``scratch`` (no allocation of their size)."""
    r, vocab = rows.numel(), z.shape[1]
    halves = scratch.view(-1)[: 2 * z.numel()].view(2, -1)
    sub = torch.index_select(z, 0, rows, out=halves[0, : r * vocab].view(r, vocab))
    inside = torch.le(sub, hi.unsqueeze(1), out=halves[1, : r * vocab].view(r, vocab))
    inside.sub_(torch.le(sub, lo.unsqueeze(1), out=sub))  # count(<= hi) - count(<= lo), entry by entry
    row_id, col = inside.nonzero(as_tuple=True)  # row-major: grouped by row
    values = z[rows[row_id], col]
    # sort by value, then stably by row: each row's entries stay contiguous, now ascending
    order = values.argsort(stable=True)
    values = values[order][row_id[order].argsort(stable=True)]
    counts = entries.long()
    start = torch.cumsum(counts, 0) - counts
    return values[start + rank.long() - 1]
