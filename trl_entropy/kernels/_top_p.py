"""SIREN's top-p set (Jiang et al., arXiv:2509.25133): each row's threshold, and the set's statistics, for both
backends.

Rank a row's logits descending, ``z_[1] >= z_[2] >= ...``, and let ``C_j = sum_{i <= j} pi_[i]`` be the cumulative
mass of the **full** softmax ``pi = softmax(z)`` and ``K' = min(top_k, V)``. The kept set ``S`` is the prefix of the
``K'`` largest whose cumulative mass stays below ``p``: the token whose mass crosses ``p`` is left out (the authors'
``searchsorted(cumsum, p)``, side left), or kept with ``include_crossing`` (the standard nucleus). As one threshold,
``S = {a : z_a > thr}`` with ``thr = max(z_[c], z_[K'+1])`` (``z_[c+1]`` with ``include_crossing``),
``c = min{j : C_j >= p}``, ``z_[V+1] = -inf``. ``pi_[1] >= p`` gives ``thr = z_[1]``: ``S`` is empty. Entries equal to
``thr`` fall outside ``S``.

Every entry of ``S`` is among the row's ``K' + 1`` largest, so what the kernel needs from ``S`` (the clamp's
statistics: the target's membership and the sums of ``e = exp(z - m)`` and ``e * (m - z)`` over ``S`` without the
target column) comes from a top-k of the row, without a pass over the whole row. The top-k starts ``FIRST_WIDTH``
wide and widens ``WIDEN`` times only for the rows whose crossing lies beyond it: a peaked row (a trained policy's
usual one) costs one top-k of ``FIRST_WIDTH + 1`` entries, a flat one up to a top-k of ``K' + 1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


FIRST_WIDTH = 128  # ranks of the first top-k
WIDEN = 8  # each further top-k is this many times wider, for the rows still open


@dataclass(frozen=True)
class TopPRule:
    """SIREN's rule: the mass ``p`` in ``(0, 1]``, ``top_k >= 1`` (None: the whole row), ``include_crossing``."""

    p: float
    top_k: int | None = None
    include_crossing: bool = False


def top_p_stats(
    z: torch.Tensor, targets: torch.Tensor, m: torch.Tensor, log_sum_e: torch.Tensor, rule: TopPRule
) -> dict[str, torch.Tensor]:
    """The top-p set's statistics of one chunk ``z`` (n, V) fp32 (left unchanged), given each row's max ``m`` and
    ``log_sum_e = log sum_a exp(z_a - m)`` (both (n,) fp32).

    Returns (n,) fp32 tensors under the names of the clamp's statistics (``_torch_ops.forward_stats``): ``thr``,
    ``kept_t`` (1 where the target is in ``S``), ``sc_rest`` and ``syc_rest`` (``sum e`` and ``sum e * (m - z)`` over
    ``S`` without the target column), and ``kept_count`` (``|S|``).
    """
    n, vocab = z.shape
    top_k = vocab if rule.top_k is None else min(rule.top_k, vocab)
    f32 = dict(dtype=torch.float32, device=z.device)
    out = {name: torch.empty(n, **f32) for name in ("thr", "kept_t", "sc_rest", "syc_rest", "kept_count")}
    z_t = z.gather(1, targets.unsqueeze(1)).squeeze(1)
    rows = torch.arange(n, device=z.device)
    width = min(top_k, FIRST_WIDTH)
    # the first top-k covers the whole chunk; the wider ones run by blocks of rows, so that their values, indices
    # and row copies stay under the chunk's own size
    block = n
    while rows.numel() > 0:
        still_open = []
        for r0 in range(0, rows.numel(), block):
            block_rows = rows[r0 : r0 + block]
            zb = z if block_rows.numel() == n else z.index_select(0, block_rows)
            values, indices = zb.topk(min(width + 1, vocab), dim=1)  # sorted, descending
            kept_len = _ranks_below_p(values[:, :width], m[block_rows], log_sum_e[block_rows], rule.p, vocab)
            crossed = kept_len < width
            if rule.include_crossing:
                kept_len = kept_len + crossed
            if width == top_k:  # the crossing is found, or lies beyond K': S is the top K'
                resolved = block_rows
            else:
                resolved = block_rows[crossed]
                still_open.append(block_rows[~crossed])
                values, indices, kept_len = values[crossed], indices[crossed], kept_len[crossed]
            _set_statistics(values, indices, kept_len, m, targets, z_t, resolved, vocab, out)
        rows = torch.cat(still_open) if still_open else rows[:0]
        width = min(top_k, width * WIDEN)
        block = max(1, z.numel() // (4 * vocab))
    return out


def _ranks_below_p(values, m, log_sum_e, p: float, vocab: int) -> torch.Tensor:
    """Per row: how many of ``values`` (the row's largest entries, descending) have ``C_j < p``. The mass is summed in
    float64 (each term is one fp32 rounding of ``pi``; the sum adds none that matters at the width of a top-k)."""
    width = values.shape[1]
    if p < 1.0:
        log_mass = (values.double() - m.double().unsqueeze(1)) - log_sum_e.double().unsqueeze(1)
        below = (torch.exp(log_mass).cumsum(1) < p).sum(1)
    else:  # C_j < 1 for every j < V: by rank, where rounding would put C_j near 1 on either side of it
        below = torch.full((values.shape[0],), width, dtype=torch.long, device=values.device)
    if width == vocab:  # C_V = 1 >= p exactly, whatever the rounding of the sum
        below = below.clamp(max=vocab - 1)
    return below


def _set_statistics(values, indices, kept_len, m, targets, z_t, rows, vocab: int, out) -> None:
    """Writes ``out[...][rows]`` for the rows whose top-k (``values``, ``indices``: descending) holds ``S``, its first
    ``kept_len`` ranks: the threshold is the next rank's value (``-inf`` past the row's last)."""
    if rows.numel() == 0:
        return
    after = values.gather(1, kept_len.clamp(max=values.shape[1] - 1).unsqueeze(1)).squeeze(1)
    thr = torch.where(kept_len < vocab, after, -math.inf)
    kept = values > thr.unsqueeze(1)  # by value: an entry tied with the threshold is out, as in the backward's mask
    m_rows, tgt = m.index_select(0, rows), targets.index_select(0, rows)
    e = torch.exp(values - m_rows.unsqueeze(1)).masked_fill_(~kept | (indices == tgt.unsqueeze(1)), 0.0)
    out["thr"].index_copy_(0, rows, thr)
    out["kept_t"].index_copy_(0, rows, (z_t.index_select(0, rows) > thr).to(torch.float32))
    out["sc_rest"].index_copy_(0, rows, e.sum(1))
    out["syc_rest"].index_copy_(0, rows, (e * (m_rows.unsqueeze(1) - values)).sum(1))
    out["kept_count"].index_copy_(0, rows, kept.sum(1).to(torch.float32))
