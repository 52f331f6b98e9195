"""References for the clamp's threshold.

* ``kth_smallest_threshold``: the PyTorch path's search as it was before the fixed-pass loop (its host reads every
  pass), a second reference for the tests of ``trl_entropy.kernels._select``: a threshold ``t`` with
  ``count(z <= t) == k``, or with ties the k-th smallest value itself.
* ``sort_keys``, ``threshold_keys`` and ``sampled_window``: the Triton path's threshold in its key order, from
  ``torch.kthvalue``, and the window its selection starts from, for the tests of its selection.
"""

from __future__ import annotations

import torch


_SAMPLE = 256  # strided sample width per row, for the first guess
_MAX_ITERS = 32  # counting passes before the remaining rows fall back to torch.kthvalue
_MAX_STALL = 8  # passes in a row without removing an entry from the bracket: ties, fall back


def kth_smallest_threshold(
    z: torch.Tensor,
    k: int,
    *,
    row_max: torch.Tensor | None = None,
    scratch: torch.Tensor | None = None,
    max_iters: int = _MAX_ITERS,
) -> torch.Tensor:
    """Per row of ``z`` (n, V), fp32: a threshold ``t`` (n,) such that ``z <= t`` selects the ``k`` smallest entries.

    ``1 <= k < V``. ``row_max`` may pass ``z.amax(1)`` when the caller already has it. ``scratch`` is an optional fp32
    buffer with at least ``z.numel()`` elements, used for the counting passes (otherwise one is allocated).
    """
    n, vocab = z.shape
    if not 1 <= k < vocab:
        raise ValueError(f"k must be in [1, V), got k={k} with V={vocab}")
    thr = torch.empty(n, dtype=z.dtype, device=z.device)
    if n == 0:
        return thr
    if scratch is None:
        scratch = torch.empty_like(z)
    scratch = scratch.view(-1)[: z.numel()].view(n, vocab)

    target = k + 0.5
    hi = (z.amax(1) if row_max is None else row_max).clone()
    lo = torch.nextafter(z.amin(1), torch.full_like(hi, -float("inf")))
    f_lo = torch.full_like(hi, -target)  # count(<= lo) - target, < 0
    f_hi = torch.full_like(hi, vocab - target)  # count(<= hi) - target, > 0
    f_lo_true, f_hi_true = f_lo.clone(), f_hi.clone()  # the same without the Illinois halving
    side = torch.zeros_like(hi)  # which end moved last: -1 lo, +1 hi
    width_c = torch.full_like(hi, float(vocab))  # count(<= hi) - count(<= lo): entries left inside the bracket
    stall = torch.zeros_like(hi)  # passes in a row that removed no entry from the bracket

    stride = max(1, vocab // _SAMPLE)
    sample = z[:, ::stride]
    width = sample.shape[1]
    pos = min(max(int(round(target / vocab * width - 0.5)), 0), width - 1)
    t = torch.kthvalue(sample, pos + 1, dim=1).values

    rows = None  # indices into z of the working set; None = all rows, in order
    work = z
    active = torch.ones(n, dtype=torch.bool, device=z.device)
    for it in range(max_iters):
        if it > 0:
            t = lo - f_lo * ((hi - lo) / (f_hi - f_lo))
            mid = lo + 0.5 * (hi - lo)
            # bisect when the guess is not strictly inside, or after a pass that removed no entry
            t = torch.where((t > lo) & (t < hi) & (stall < 1), t, mid)
        buf = scratch[: work.shape[0]]
        torch.le(work, t.unsqueeze(1), out=buf)
        f = buf.sum(1) - target  # fp32 sums of 0/1 are exact below 2**24
        hit = active & (f < 0) & (f > -1)  # count == k
        if bool(hit.any()):
            if rows is None:
                thr[hit] = t[hit]
            else:
                thr[rows[hit]] = t[hit]
        active = active & ~hit
        below = active & (f < 0)
        above = active & (f > 0)
        f_hi = torch.where(below & (side < 0), 0.5 * f_hi, f_hi)
        f_lo = torch.where(above & (side > 0), 0.5 * f_lo, f_lo)
        lo = torch.where(below, t, lo)
        f_lo = torch.where(below, f, f_lo)
        hi = torch.where(above, t, hi)
        f_hi = torch.where(above, f, f_hi)
        side = torch.where(below, -1.0, torch.where(above, 1.0, side))
        # Ties straddling the k-th position: the bracket keeps shrinking in value but never loses an entry (or has
        # shrunk to adjacent floats). Continuous data loses entries on almost every pass.
        f_lo_true = torch.where(below, f, f_lo_true)
        f_hi_true = torch.where(above, f, f_hi_true)
        new_width = f_hi_true - f_lo_true
        stall = torch.where(new_width < width_c, 0.0, stall + 1.0)
        width_c = new_width
        mid = lo + 0.5 * (hi - lo)
        active_split = active & (mid > lo) & (mid < hi) & (stall < _MAX_STALL)
        n_active = int(active_split.sum())
        if n_active == 0:
            break
        if n_active * 2 <= work.shape[0]:
            keep = active_split.nonzero().squeeze(1)
            rows_all = torch.arange(n, device=z.device) if rows is None else rows
            stuck = active & ~active_split
            if bool(stuck.any()):
                _fallback(z, k, thr, rows_all[stuck])
            rows = rows_all.index_select(0, keep)
            work = work.index_select(0, keep)
            lo, hi, f_lo, f_hi, f_lo_true, f_hi_true, side, t, width_c, stall = (
                x.index_select(0, keep) for x in (lo, hi, f_lo, f_hi, f_lo_true, f_hi_true, side, t, width_c, stall)
            )
            active = torch.ones(keep.numel(), dtype=torch.bool, device=z.device)
    if bool(active.any()):
        rows_all = torch.arange(n, device=z.device) if rows is None else rows
        _fallback(z, k, thr, rows_all[active])
    return thr


def _fallback(z: torch.Tensor, k: int, thr: torch.Tensor, rows: torch.Tensor) -> None:
    thr[rows] = torch.kthvalue(z.index_select(0, rows), k, dim=1).values


def sort_keys(z: torch.Tensor) -> torch.Tensor:
    """int64 keys of fp32 ``z`` whose integer order is the float order: the bits as int32, with the 31 low bits
    flipped for negative values (-0.0 sorts just below +0.0)."""
    bits = z.contiguous().view(torch.int32).long()
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def threshold_keys(z: torch.Tensor, k: int) -> torch.Tensor:
    """Per row, the key of the Triton kernel's threshold: the k-th smallest value's (``torch.kthvalue``), or one below
    the row maximum's when the k-th smallest is the maximum (the max is always kept)."""
    kth = sort_keys(torch.kthvalue(z, k, dim=1).values)
    return torch.minimum(kth, sort_keys(z.amax(1)) - 1)


def sampled_window(z: torch.Tensor, k: int, sample: int, span: int) -> list[torch.Tensor | None]:
    """Per row, the entries of the Triton kernel's window in row order, or None where the k-th smallest is not in it:
    the ``sample`` entries at columns ``(i * V) // sample``, sorted; ``lo`` and ``hi`` the sorted sample's entries
    ``span`` ranks below and above rank ``((2k - 1) * sample) // (2V)`` (no bound past either end); the window is
    every entry with ``lo < key <= hi``."""
    vocab = z.shape[1]
    keys = sort_keys(z)
    sampled = keys[:, (torch.arange(sample) * vocab) // sample].sort(1).values
    centre = ((2 * k - 1) * sample) // (2 * vocab)
    windows = []
    for i, (row, sample_row) in enumerate(zip(keys, sampled)):
        above_lo = row > sample_row[centre - span] if centre - span >= 0 else torch.ones_like(row, dtype=torch.bool)
        to_hi = row <= sample_row[centre + span] if centre + span < sample else torch.ones_like(row, dtype=torch.bool)
        below = int((~above_lo).sum())
        inside = above_lo & to_hi
        windows.append(z[i][inside] if below < k <= below + int(inside.sum()) else None)
    return windows
