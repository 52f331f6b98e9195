"""PyTorch implementation of the per-chunk work: forward row statistics and the backward logits gradient.

Both functions work on one chunk of logits ``z`` (rows = tokens, fp32, contiguous) and may overwrite it; the caller
(`logprob_entropy.py`) owns the chunking, the matmuls and the per-token bookkeeping. Notation, per row:

* ``m``  the row max, ``y = m - z >= 0`` (exact near the max), ``e = exp(-y)``;
* ``s_rest`` / ``sy_rest``: ``sum e`` / ``sum e*y`` over the row **without the target column** (the target's own
  term is added back from its logit, so that ``1 - p_target`` never comes out of a cancellation);
* with a clamp, ``thr`` is the row's k-th smallest logit, kept entries are ``z > thr``, and ``sc_rest`` /
  ``syc_rest`` are the same sums restricted to kept entries. With SIREN's top-p set, ``_top_p.py`` gives ``thr`` and
  these sums instead, and ``grad_tile`` uses them the same way.

The kept set travels from the forward to the backward as bits, one per logit (``pack_kept`` / ``unpack_kept``: bit
``j`` of byte ``b`` of a row is column ``8 b + j``), so that the backward reads the forward's set whatever the
rounding of its own recomputed logits.
"""

from __future__ import annotations

import torch

from ._select import kth_smallest_threshold


def kept_mask(z: torch.Tensor, thr: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The clamp's kept entries of ``z`` (rows, or one value per row): strictly above the row's threshold. Every entry
    equal to the k-th smallest value is dropped with it. fp32 0/1 into ``out`` when given, bool otherwise."""
    thr = thr.unsqueeze(1) if z.dim() == 2 else thr
    return torch.gt(z, thr, out=out) if out is not None else torch.gt(z, thr)


def kept_bytes(vocab: int) -> int:
    """Bytes per row of the kept set's bits."""
    return (vocab + 7) // 8


def pack_kept(kept: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Packs ``kept`` (n, V), 0/1 or bool, into the bits ``out`` (n, ``kept_bytes(V)``) uint8, and returns ``out``.

    Eight 0/1 bytes read as one little-endian int64 ``w`` hold entry ``j`` at bit ``8 j``; ``w | w >> 7`` moves entry
    ``j + 1`` next to it, then ``>> 14`` and ``>> 28`` the next pairs and fours, so that the low byte is the eight
    entries' bits (three shifts instead of a reduction over bytes).
    """
    n, vocab = kept.shape
    whole = vocab // 8
    if whole:
        words = kept[:, : whole * 8].to(torch.uint8).reshape(-1).view(torch.int64).view(n, whole)
        words |= words >> 7
        words |= words >> 14
        words |= words >> 28
        out[:, :whole] = words.to(torch.uint8)  # the low byte
    if vocab > whole * 8:  # the last byte's high bits stay 0
        tail = kept[:, whole * 8 :].to(torch.uint8)
        shifts = torch.arange(vocab - whole * 8, dtype=torch.uint8, device=kept.device)
        out[:, whole] = tail.bitwise_left_shift(shifts).sum(1, dtype=torch.uint8)
    return out


def unpack_kept(bits: torch.Tensor, vocab_start: int, width: int, out: torch.Tensor) -> torch.Tensor:
    """Columns ``vocab_start : vocab_start + width`` of the kept set packed in ``bits`` (n, bytes) uint8, as 0/1 in
    ``out`` (n, width), any dtype; returns ``out``."""
    first, last = vocab_start // 8, (vocab_start + width + 7) // 8
    shifts = torch.arange(8, dtype=torch.uint8, device=bits.device)
    unpacked = bits[:, first:last].unsqueeze(2).bitwise_right_shift(shifts).bitwise_and_(1)
    offset = vocab_start - 8 * first
    return out.copy_(unpacked.view(bits.shape[0], -1)[:, offset : offset + width])


def _block_rows(z: torch.Tensor, width: int) -> int:
    """Rows per block for the element-wise work: a cache-sized block on the CPU (each block's temporaries are written
    and read back while they are still in cache), the whole chunk on a GPU."""
    if z.device.type != "cpu":
        return max(1, z.shape[0])
    return max(1, BLOCK_BYTES_CPU // (4 * max(1, width)))


BLOCK_BYTES_CPU = 1 << 20  # bytes of logits per row block on the CPU


def forward_stats(
    z: torch.Tensor, targets: torch.Tensor, k: int, work: torch.Tensor, kept_bits: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """Row statistics of one chunk. ``z`` (n, V) fp32 is destroyed with a clamp (``k > 0``), left unchanged without
    one (the top-p set is selected from it afterwards); ``work`` is an fp32 buffer of >= 2 * z.numel(). With a clamp
    and ``kept_bits`` (n, ``kept_bytes(V)``) uint8, the kept set is packed into it.

    Row block by row block (cache-sized on the CPU), ``e`` and ``-e*y`` sit in one ``(b, 2, V)`` buffer: their row
    sums are one reduction, and the two clamped sums one batched matrix-vector product with the kept mask (no masked
    copy).
    """
    n, vocab = z.shape
    tgt = targets.unsqueeze(1)

    m = z.amax(1)
    z_t = z.gather(1, tgt).squeeze(1)
    out = {"m": m, "y_t": m - z_t}
    if k > 0:
        thr = kth_smallest_threshold(z, k, row_max=m, scratch=work)
        # at least the max is kept, even when the whole row ties
        thr = torch.minimum(thr, torch.nextafter(m, torch.full_like(m, -float("inf"))))
        out["thr"] = thr
        out["kept_t"] = kept_mask(z_t, thr).to(torch.float32)

    sums = torch.empty(n, 2, dtype=z.dtype, device=z.device)
    sums_c = torch.empty(n, 2, 1, dtype=z.dtype, device=z.device) if k > 0 else None
    rows = _block_rows(z, vocab)
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        zb = z[r0:r1]
        b = r1 - r0
        pair = work.view(-1)[: 2 * zb.numel()].view(b, 2, vocab)  # pair[:, 0] = e, pair[:, 1] = -e*y
        e, neg_ey = pair[:, 0], pair[:, 1]
        torch.sub(zb, m[r0:r1].unsqueeze(1), out=neg_ey)  # -y
        torch.exp(neg_ey, out=e)
        e.scatter_(1, tgt[r0:r1], 0.0)
        neg_ey.mul_(e)
        torch.sum(pair, 2, out=sums[r0:r1])
        if k > 0:
            kept = kept_mask(zb, thr[r0:r1], out=zb)  # 0/1 in fp32, over z (no longer needed)
            if kept_bits is not None:
                pack_kept(kept, kept_bits[r0:r1])
            if z.device.type == "cpu":  # a matrix-vector product per row: the CPU's batched one is ~3x slower
                for pair_row, kept_row, out_row in zip(pair.unbind(), kept.unbind(), sums_c[r0:r1, :, 0].unbind()):
                    torch.mv(pair_row, kept_row, out=out_row)
            else:
                torch.bmm(pair, kept.unsqueeze(2), out=sums_c[r0:r1])
    out["s_rest"] = sums[:, 0]
    out["sy_rest"] = sums[:, 1].neg()
    if k > 0:
        out["sc_rest"] = sums_c[:, 0, 0]
        out["syc_rest"] = sums_c[:, 1, 0].neg()
    return out


def grad_tile(
    z: torch.Tensor,
    vocab_start: int,
    targets: torch.Tensor,
    coef: dict[str, torch.Tensor],
    work: torch.Tensor,
    dtanh: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    scale: float = 1.0,
) -> torch.Tensor:
    """Gradient of the loss w.r.t. one tile of logits ``z`` (n, w) (columns ``vocab_start:vocab_start + w``).

    ``z`` is destroyed; the gradient is returned in a buffer carved from ``work`` (fp32, >= 3 * z.numel()). With the
    soft-cap's ``dtanh`` (n, w) it is ``dL/dy = dL/dz * dtanh``. With ``out`` (n, w, the GEMMs' half-precision
    operand) it is ``scale * dL/dy``, rounded into ``out`` (one fp32 product, then the rounding), and ``out`` is
    returned.
    ``coef`` holds the per-row vectors prepared by ``logprob_entropy._backward_coefficients``:

    * always ``m``, ``neg_logs`` (``-log sum e``), ``a0`` and optional ``b0`` (the non-clamped coefficient
      ``c(y) = a0 + b0 * y``, so that ``dL/dz = p * c(y)`` away from the target);
    * with a clamped-entropy gradient, ``kept_bits`` (n, bytes: the forward's kept set, ``pack_kept``), ``da``,
      ``db``: kept entries add ``da + db * y``;
    * ``g_lp``, ``om`` (``-expm1(log_prob)``), ``g_h``, ``ybar``, ``g_cr``, ``ybar_c`` for the target entry, which
      is rebuilt exactly as ``g_lp * (1 - p_t) + p_t * (g_h (y_t - ybar) + [kept] g_cr (y_t - ybar_c))``.
    """
    n, width = z.shape
    numel = z.numel()
    p = work.view(-1)[:numel].view(n, width)
    rows = _block_rows(z, width)
    # the clamp's slope per row as numbers, for the CPU's per-row fused add below
    db_rows = coef["db"].tolist() if "db" in coef and z.device.type == "cpu" else None
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        block = (r1 - r0) * width
        # c and d live in a block-sized part of work, reused: on the CPU they stay in cache
        c = work.view(-1)[numel : numel + block].view(r1 - r0, width)
        d = work.view(-1)[numel + block : numel + 2 * block].view(r1 - r0, width)
        coef_b = {name: t[r0:r1] for name, t in coef.items()}
        rows_db = None if db_rows is None else db_rows[r0:r1]
        _grad_rows(z[r0:r1], vocab_start, targets[r0:r1], coef_b, p[r0:r1], c, d, rows_db)
    if dtanh is not None:
        p.mul_(dtanh)
    return p if out is None else torch.mul(p, scale, out=out)


def _grad_rows(z, vocab_start, targets, coef, p, c, d, db_rows=None):
    """``grad_tile`` for a block of rows: ``dL/dz`` into ``p``, with ``c``, ``d`` buffers of the same shape.
    ``db_rows``: ``coef["db"]`` as numbers (on the CPU)."""
    n, width = z.shape
    has_clamp = "kept_bits" in coef

    local = targets - vocab_start
    in_tile = (local >= 0) & (local < width)
    cols = local.clamp(0, width - 1).unsqueeze(1)  # rows whose target is outside the tile are masked below

    if has_clamp:
        kept = unpack_kept(coef["kept_bits"], vocab_start, width, out=d)
        kept_t = kept.gather(1, cols).squeeze(1)
    y = torch.sub(coef["m"].unsqueeze(1), z, out=z)
    torch.sub(coef["neg_logs"].unsqueeze(1), y, out=p).exp_()
    y_t = y.gather(1, cols).squeeze(1)
    p_t = p.gather(1, cols).squeeze(1)

    a0 = coef["a0"].unsqueeze(1)
    if "b0" not in coef and not has_clamp:
        p.mul_(a0)
    else:
        if "b0" in coef:
            torch.addcmul(a0, coef["b0"].unsqueeze(1), y, out=c)
        else:
            c.copy_(a0.expand(n, width))
        if has_clamp:
            # c += kept * (da + db * y), with kept in d
            if db_rows is None:
                dk = torch.addcmul(coef["da"].unsqueeze(1), coef["db"].unsqueeze(1), y, out=y)
            else:  # the CPU's addcmul with per-row operands is ~2x slower than one add per row (same rounding: one)
                for intercept, y_row, slope in zip(coef["da"].unbind(), y.unbind(), db_rows):
                    torch.add(intercept, y_row, alpha=slope, out=y_row)
                dk = y
            c.addcmul_(dk, kept)
        p.mul_(c)

    # the target entry, rebuilt without cancellation
    g_t = torch.zeros_like(y_t)
    if "g_lp" in coef:
        g_t += coef["g_lp"] * coef["om"]
    rest = torch.zeros_like(y_t)
    if "g_h" in coef:
        rest += coef["g_h"] * (y_t - coef["ybar"])
    if has_clamp:
        rest += kept_t * coef["g_cr"] * (y_t - coef["ybar_c"])
    g_t += p_t * rest
    if bool(in_tile.all()):
        p.scatter_(1, cols, g_t.unsqueeze(1))
    else:
        rows = in_tile.nonzero().squeeze(1)
        p[rows, cols.index_select(0, rows).squeeze(1)] = g_t.index_select(0, rows)
    return p
