"""Row-wise k-th smallest logit (the clamp threshold) without sorting the row, and without a host synchronisation
per pass.

The clamped entropy drops, in every row, the entries ``<=`` the row's k-th smallest logit ``z_(k)``. All it needs
from a row is a threshold ``t`` with ``z <= t`` selecting exactly those entries: ``z_(k)`` itself, or any value in
``[z_(k), z_(k+1))``. Sorting or ``topk`` of a 150k-wide row is far more work than that, and ``torch.kthvalue`` on
the CPU (it copies every row with its indices and quick-selects it) costs ~15-18 ns per logit, close to the chunk's
own matmul at d = 512. This module finds the threshold by a **counting search on the value**: each pass is one
compare and one row sum (``count(z <= t)``).

1. A strided sample of each row (``_SAMPLE`` columns) gives two guesses on both sides of the target rank (two of
   its order statistics, by ``topk``), counted in the first pass: most rows start with a verified bracket
   ``count(<= lo) <= k < count(<= hi)`` a few percent of the row wide. A row whose lower guess is already above
   the target has no verified ``lo`` (there is no pass for the row minimum) and ends by ``torch.kthvalue``.
2. Each further pass interpolates the counts inside the bracket towards rank ``k + 1/2`` (regula falsi with the
   Illinois modification). A guess that counts exactly ``k`` becomes ``lo`` and is the answer (later guesses lie
   above it).
3. After the fixed number of passes (``passes``) each row's bracket usually holds a few entries. The block marks
   them while it is in cache (one compare with the end that did not move last: the compare buffer holds the other)
   and counts them per segment of ``_SEGMENT`` columns, so that the finish reads only the segments that hold them:
   the ``k - count(<= lo)``-th smallest of the entries inside the bracket is picked from those few values. A row
   whose bracket is still wide (ties over a large part of the row, a constant row, ``-inf`` entries) ends by
   ``torch.kthvalue``.

No pass reads a value back from the device: a GPU does not stall on the loop. After it, at most four host reads per
call (how many rows end each way, which rows, which segments, which entries), whatever the number of passes.

The passes run by blocks of rows (``block_rows``): on the CPU a block of ``_BLOCK_BYTES_CPU`` bytes of logits, small
enough that the block and the compare's output stay in the core's L2 cache through every pass (~0.2 ns per logit
for a count instead of ~0.5-1 ns from memory); there the per-row bookkeeping between passes (a few dozen operations
on a handful of numbers) runs in NumPy, whose small operations cost a fraction of PyTorch's. On a GPU the whole chunk
is one block and the bookkeeping stays on the device.

Rows of fewer than ``2 * _SAMPLE`` entries go to ``torch.kthvalue`` straight away (the sample would be the row).

The result is exact either way: a ``t`` with ``count(<= t) == k``, or the k-th smallest value itself (with ties at
the boundary, every entry equal to it counts as ``<= t``).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch


_SAMPLE = 512  # strided sample width per row, for the first guesses
_PASSES = 5  # counting passes over each block (the first one counts two guesses)
_SPREAD = 2.5  # the first two guesses sit this many standard deviations of the sample quantile apart from the target
_FINISH_MAX = 4096  # open brackets with at most this many entries end by the small exact pick, wider ones by kthvalue
_SEGMENT = 64  # columns per segment of the finish's per-segment counts
_BLOCK_BYTES_CPU = 512 << 10  # a block and the compare's output stay in one core's L2 cache (2 MiB here)
_UPPER = np.array([[False], [True]])  # selects hi in a stacked (lo, hi) pair


def kth_smallest_threshold(
    z: torch.Tensor,
    k: int,
    *,
    row_max: torch.Tensor | None = None,
    scratch: torch.Tensor | None = None,
    passes: int | None = None,
    block_rows: int | None = None,
    host_bookkeeping: bool | None = None,
) -> torch.Tensor:
    """Per row of ``z`` (n, V), fp32 without NaN: a threshold ``t`` (n,) such that ``z <= t`` selects exactly the
    entries ``<=`` the k-th smallest value of the row (the ``k`` smallest ones when there is no tie at the boundary).

    ``1 <= k < V``. ``row_max`` may pass ``z.amax(1)`` when the caller already has it. ``scratch`` is an optional fp32
    buffer with at least ``2 * z.numel()`` elements (otherwise one is allocated). ``passes`` >= 1 (default
    ``_PASSES``) is the number of counting passes before the rows still open are finished exactly (any value gives the
    same result). ``block_rows`` (default: the whole chunk on a GPU, a cache-sized block on the CPU) is how many rows
    go through the passes together (any value gives the same result). ``host_bookkeeping`` (default: for CPU tensors)
    keeps the per-row state between passes in NumPy instead of on ``z``'s device (the same result either way).
    """
    n, vocab = z.shape
    passes = _PASSES if passes is None else passes
    if not 1 <= k < vocab:
        raise ValueError(f"k must be in [1, V), got k={k} with V={vocab}")
    if n == 0:
        return torch.empty(0, dtype=z.dtype, device=z.device)
    if vocab < 2 * _SAMPLE:  # short rows: the sample would be (nearly) the whole row
        return torch.kthvalue(z, k, dim=1).values
    if scratch is None:
        scratch = torch.empty(2 * z.numel(), dtype=z.dtype, device=z.device)
    target = k + 0.5
    rows = _block_rows(z) if block_rows is None else max(1, int(block_rows))
    row_max = z.amax(1) if row_max is None else row_max
    on_host = z.device.type == "cpu" if host_bookkeeping is None else bool(host_bookkeeping)
    if on_host and z.device.type != "cpu":
        raise ValueError(f"host_bookkeeping=True needs z on the CPU, got {z.device}")
    xp = np if on_host else torch  # NumPy arrays here are views of the CPU tensors' memory, not copies
    guesses = _sample_guesses(z, target)
    # per row: lo, hi, count(<= lo) - target, count(<= hi) - target; per segment of a row: entries in (lo, hi]
    state = torch.empty(4, n, dtype=torch.float32, device=z.device)
    segments = torch.empty(n, -(-vocab // _SEGMENT), dtype=torch.float32, device=z.device)
    state_xp, guesses_xp = (t.numpy() if on_host else t for t in (state, guesses))
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        zb = z[r0:r1]
        bufs = scratch.view(-1)[: 2 * zb.numel()].view(2, r1 - r0, vocab)
        state_xp[:, r0:r1] = _search_block(zb, guesses_xp[:, r0:r1], row_max[r0:r1], bufs, passes, target, xp)
        _count_by_segment(bufs[0], segments[r0:r1])
    lo, hi, f_lo, f_hi = state
    done = f_lo > -1  # count(<= lo) == k

    # The rows still open. One host read: how many end inside their bracket and how many by kthvalue.
    entries = f_hi - f_lo  # count(<= hi) - count(<= lo)
    small = ~done & (entries <= _FINISH_MAX) & torch.isfinite(lo)
    wide = ~done & ~small
    n_small, n_wide = divmod(int((small.sum() * (n + 1) + wide.sum()).item()), n + 1)
    thr = lo.clone()
    if n_small + n_wide == 0:
        return thr
    # which rows: one read for both kinds (the small ones first)
    open_rows = (~done).nonzero().squeeze(1)
    open_rows = open_rows[torch.argsort(wide[open_rows].to(torch.int8), stable=True)]
    if n_small > 0:
        rows = open_rows[:n_small]
        rank = k - (f_lo[rows] + target).round()  # of z_(k) among the bracket's entries, from 1
        found = _finish_in_bracket(z, rows, lo[rows], hi[rows], rank, entries[rows], segments[rows])
        thr.index_copy_(0, rows, found)
    if n_wide > 0:
        rows = open_rows[n_small:]
        thr.index_copy_(0, rows, torch.kthvalue(z.index_select(0, rows), k, dim=1).values)
    return thr


def _block_rows(z: torch.Tensor) -> int:
    """Rows per block for the counting passes: the whole chunk on a GPU, a cache-sized block on the CPU."""
    if z.device.type != "cpu":
        return max(1, z.shape[0])
    return max(1, _BLOCK_BYTES_CPU // (z.element_size() * max(1, z.shape[1])))


def _sample_guesses(z: torch.Tensor, target: float) -> torch.Tensor:
    """(2, n): two order statistics of each row's strided sample, about ``_SPREAD`` standard deviations of the
    sample quantile below and above the target rank."""
    vocab = z.shape[1]
    sample = z[:, :: vocab // _SAMPLE]
    width = sample.shape[1]
    q = target / vocab
    spread = _SPREAD * math.sqrt(q * (1 - q) / width) + 1.0 / width
    pos1, pos2 = (min(max(int(round(u * width - 0.5)), 0), width - 1) for u in (q - spread, q + spread))
    # the sample's order statistics at pos1 <= pos2 without sorting it (a sort, with its indices, costs more): the
    # max of its pos2 + 1 smallest, and the min of the pos2 - pos1 + 1 largest of those
    smallest = sample.topk(pos2 + 1, 1, largest=False, sorted=False).values
    return torch.stack([smallest.topk(pos2 - pos1 + 1, 1, sorted=False).values.amin(1), smallest.amax(1)])


def _search_block(z, guesses, row_max, bufs, passes, target, xp):
    """The counting passes over one block of rows ``z`` (b, V), with the bookkeeping in ``xp`` (NumPy or torch).
    Returns ``(lo, hi, f_lo, f_hi)`` (4, b): per row the bracket and its counts minus ``target`` (``f_lo == -1/2``:
    ``lo`` is the answer). Leaves in ``bufs[0]`` +-1 on the entries inside each row's bracket, 0 elsewhere."""
    buf = bufs[0]
    vocab = z.shape[1]
    on_host = xp is np

    sums = torch.empty(z.shape[0], dtype=z.dtype, device=z.device)
    sums_xp = sums.numpy() if on_host else sums

    def count(t):
        """``count(z <= t) - target`` per row (fp32 sums of 0/1 are exact below 2**24)."""
        torch.le(z, torch.from_numpy(t[:, None]) if on_host else t[:, None], out=buf)
        torch.sum(buf, 1, out=sums)
        return sums_xp - target

    # Pass 1, the two guesses g1 <= g2. The bracket lo < z_(k) <= hi, with f = count - target (f_lo < 0 < f_hi): lo
    # is the larger guess below the target, or -inf when neither is (unverified: such a row, like a row whose lo is
    # -inf because of -inf entries, cannot interpolate and ends by kthvalue); hi the smaller guess above it, or the
    # row's maximum (a count of V).
    (g1, g2), (hi0,) = guesses, (row_max.numpy() if on_host else row_max,)
    f1, f2 = count(g1), count(g2)
    below1, below2 = f1 < 0, f2 < 0  # below2 implies below1
    ends = xp.stack(
        [xp.where(below2, g2, xp.where(below1, g1, -math.inf)), xp.where(below1, xp.where(below2, hi0, g2), g1)]
    )
    f_ends = xp.stack(
        [
            xp.where(below2, f2, xp.where(below1, f1, -target)),
            xp.where(below1, xp.where(below2, vocab - target, f2), f1),
        ]
    )
    f_true = f_ends  # the same without the Illinois halving
    upper = _UPPER if on_host else torch.arange(2, device=z.device).unsqueeze(1) == 1
    moved = below2[None] != upper  # which end moved last: (lo, hi)
    with np.errstate(invalid="ignore") if on_host else contextlib.nullcontext():  # the NaN guesses above
        for _ in range(passes - 1):
            (lo, hi), (f_lo, f_hi) = ends, f_ends
            t = lo - f_lo * ((hi - lo) / (f_hi - f_lo))  # inside [lo, hi]; NaN only where lo = -inf
            f = count(t)
            below = f < 0
            move = below[None] != upper
            # Illinois: the end that stays has its f halved when it also stayed the pass before
            f_ends = xp.where(move, f, xp.where(moved, f_ends, 0.5 * f_ends))
            ends, f_true, moved = xp.where(move, t, ends), xp.where(move, f, f_true), move
    # the entries inside the brackets: buf holds z <= (the end that moved last), so one compare with the other end
    # (after pass 1 alone buf holds z <= g2, which may be neither end: then lo = -inf and the row ends by kthvalue)
    stayed = xp.where(moved[0], ends[1], ends[0])
    other = torch.le(z, (torch.from_numpy(stayed) if on_host else stayed).unsqueeze(1), out=bufs[1])
    torch.sub(other, buf, out=buf)
    return xp.concatenate([ends, f_true])


def _count_by_segment(inside, out):
    """Per row of ``inside`` (b, V; +-1 on the entries inside the bracket, one sign per row): the entries per segment
    of ``_SEGMENT`` columns (the last one may be shorter), into ``out`` (b, ceil(V / _SEGMENT))."""
    vocab = inside.shape[1]
    whole = vocab // _SEGMENT
    torch.sum(inside[:, : whole * _SEGMENT].unflatten(1, (whole, _SEGMENT)), 2, out=out[:, :whole])
    if whole < out.shape[1]:
        torch.sum(inside[:, whole * _SEGMENT :], 1, out=out[:, whole])
    out.abs_()


def _finish_in_bracket(z, rows, lo, hi, rank, entries, segments):
    """For each of ``rows``: the ``rank``-th smallest of its ``entries`` entries ``lo < z <= hi``, read from the
    segments that hold them (``segments``: their count per segment) and sorted."""
    vocab = z.shape[1]
    row_id, segment = segments.nonzero(as_tuple=True)  # row-major: grouped by row
    cols = segment.unsqueeze(1) * _SEGMENT + torch.arange(_SEGMENT, device=z.device)
    valid = cols < vocab  # the last segment may be shorter
    values = z[rows[row_id].unsqueeze(1), cols.clamp_(max=vocab - 1)]
    inside = valid & (values > lo[row_id].unsqueeze(1)) & (values <= hi[row_id].unsqueeze(1))
    which = inside.nonzero(as_tuple=True)  # row-major again: still grouped by row
    values, owner = values[which], row_id[which[0]]
    # sort by value, then stably by row: each row's entries stay contiguous, now ascending
    order = values.argsort(stable=True)
    values = values[order][owner[order].argsort(stable=True)]
    counts = entries.long()
    start = torch.cumsum(counts, 0) - counts
    return values[start + rank.long() - 1]
