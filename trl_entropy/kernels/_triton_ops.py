"""Triton implementation of the per-chunk work (same contract as `_torch_ops.py`).

Imported lazily, on the first call with ``backend="triton"`` (or ``"auto"`` on a CUDA tensor). Triton reads
``TRITON_INTERPRET`` when the kernels below are decorated, i.e. when this module is first imported: to run them on
CPU tensors, set ``TRITON_INTERPRET=1`` before the first Triton call in the process.

Kernels
-------
``_forward_stats_kernel``, one program per token (row of the chunk's logits, which cuBLAS wrote in fp32):

1. one streaming pass for the row max and the target logit; with a clamp, the same pass builds the histogram of the
   first radix digit of every entry's sort key (fp32 values mapped to int32 keys whose integer order is the float
   order: negative floats get their 31 low bits flipped);
2. with a clamp, the k-th smallest key by an exact **radix select** over digits of 11, 11 and 10 bits (the first one
   holds the sign, the exponent and two mantissa bits): the bucket holding the k-th smallest entry fixes the digit
   and the rank inside it. A second pass over the row histograms the second digit of the entries in that bucket and
   writes them, in row order, to the row's part of a scratch buffer (``scratch_per_row`` entries); the third digit's
   histogram then reads only those. A bucket larger than the scratch row is not written, and the third pass reads
   the whole row again (same result, one more pass);
3. one streaming pass for ``sum exp(-y)`` and ``sum exp(-y) * y`` (``y = m - z``) without the target column, and the
   same over kept entries (``key(z) > key(thr)``).

``_grad_tile_kernel``, one program per (token, block of columns): recomputes ``p`` from the saved row statistics and
overwrites the logits block with ``dL/dz`` (the gradient GEMMs then run in torch/cuBLAS).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton import knobs


INTERPRET = bool(knobs.runtime.interpret)
# Scratch entries per row for the first bucket's candidates: V / SCRATCH_FRACTION. A first-digit bucket spans 1/8 to
# 1/4 of its values' magnitude: a centred Gaussian row's fullest bucket holds ~5.5 % of it, the k = 0.3 V bucket of
# N(-5, 2.5) rows ~13 %; rows far from zero against their spread overflow and pay the fallback's extra pass.
SCRATCH_FRACTION = 4

# Sort keys: an fp32 value's bits as int32, with the 31 low bits flipped for negative values, order like the floats
# (non-NaN). Written inline in the kernels: the interpreter re-patches triton.language on every nested jit call,
# which made a helper function cost ~7 ms per call under TRITON_INTERPRET=1.


@triton.jit
def _forward_stats_kernel(
    z_ptr,
    stride_z,
    tgt_ptr,
    n_cols,
    k,
    scratch_ptr,
    scratch_per_row,
    m_ptr,
    yt_ptr,
    s_ptr,
    sy_ptr,
    thr_ptr,
    keptt_ptr,
    sc_ptr,
    syc_ptr,
    HAS_CLAMP: tl.constexpr,
    BLOCK: tl.constexpr,
    SEL_BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = z_ptr + row * stride_z
    tgt = tl.load(tgt_ptr + row).to(tl.int64)

    # pass 1: max; with a clamp, the histogram of the keys' top 11 bits (key >> 21, shifted to [0, 2048))
    vmax = tl.full([BLOCK], -float("inf"), tl.float32)
    hist_hi = tl.zeros([2048], tl.int32)
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        msk = offs < n_cols
        z = tl.load(base + offs, mask=msk, other=-float("inf"))
        vmax = tl.maximum(vmax, z)
        if HAS_CLAMP:
            bz = z.to(tl.int32, bitcast=True)
            kz = tl.where(bz < 0, bz ^ 0x7FFFFFFF, bz)
            hist_hi += tl.histogram((kz >> 21) + 1024, 2048, mask=msk)
    m = tl.max(vmax, axis=0)
    z_t = tl.load(base + tgt)
    y_t = m - z_t
    tl.store(m_ptr + row, m)
    tl.store(yt_ptr + row, y_t)

    # pass 2 (clamp): radix select of the k-th smallest key, 11 + 11 + 10 bits. Each digit is the first bucket whose
    # cumulative count reaches the rank; the rank then counts inside that bucket.
    thr_key = tl.full([], 0, tl.int64)
    if HAS_CLAMP:
        cum = tl.cumsum(hist_hi, axis=0)
        before = tl.max(tl.where(cum < k, cum, 0), axis=0)
        prefix_hi = tl.sum((cum < k).to(tl.int32), axis=0) - 1024  # = key >> 21 of the k-th smallest
        n_cand = tl.min(tl.where(cum < k, n_cols, cum), axis=0) - before
        rank = k - before
        # the bucket's entries, in row order, into the scratch row when they fit (else it stays unused)
        fits = n_cand <= scratch_per_row
        n_slots = tl.where(fits, scratch_per_row, 0)
        scratch_row = scratch_ptr + row * scratch_per_row
        hist_mid = tl.zeros([2048], tl.int32)
        n_written = tl.full([], 0, tl.int32)
        for start in range(0, n_cols, SEL_BLOCK):
            offs = start + tl.arange(0, SEL_BLOCK)
            msk = offs < n_cols
            z = tl.load(base + offs, mask=msk, other=0.0)
            bz = z.to(tl.int32, bitcast=True)
            kz = tl.where(bz < 0, bz ^ 0x7FFFFFFF, bz)
            cand = msk & ((kz >> 21) == prefix_hi)
            hist_mid += tl.histogram((kz >> 10) & 2047, 2048, mask=cand)
            cand32 = cand.to(tl.int32)
            slot = n_written + tl.cumsum(cand32, axis=0) - 1
            tl.store(scratch_row + slot, z, mask=cand & (slot < n_slots))
            n_written += tl.sum(cand32, axis=0)
        tl.debug_barrier()  # the scratch row's entries, stored by some of the program's threads, are read by others
        cum = tl.cumsum(hist_mid, axis=0)
        before = tl.max(tl.where(cum < rank, cum, 0), axis=0)
        prefix_mid = prefix_hi * 2048 + tl.sum((cum < rank).to(tl.int32), axis=0)  # = key >> 10
        rank -= before
        # the last digit over the scratch row, or over the whole row when the bucket did not fit
        if fits:
            src = scratch_row
            n_src = n_cand
        else:
            src = base
            n_src = n_cols
        hist_lo = tl.zeros([1024], tl.int32)
        for start in range(0, n_src, SEL_BLOCK):
            offs = start + tl.arange(0, SEL_BLOCK)
            msk = offs < n_src
            bz = tl.load(src + offs, mask=msk, other=0.0).to(tl.int32, bitcast=True)
            kz = tl.where(bz < 0, bz ^ 0x7FFFFFFF, bz)
            hist_lo += tl.histogram(kz & 1023, 1024, mask=msk & ((kz >> 10) == prefix_mid))
        cum = tl.cumsum(hist_lo, axis=0)
        kth_key = prefix_mid.to(tl.int64) * 1024 + tl.sum((cum < rank).to(tl.int64), axis=0)
        b_max = m.to(tl.int32, bitcast=True)
        key_max = tl.where(b_max < 0, b_max ^ 0x7FFFFFFF, b_max).to(tl.int64)
        # keep at least the max, even when the whole row ties
        thr_key = tl.minimum(kth_key, key_max - 1)
        thr_bits = tl.where(thr_key < 0, thr_key ^ 0x7FFFFFFF, thr_key).to(tl.int32)
        tl.store(thr_ptr + row, thr_bits.to(tl.float32, bitcast=True))
        b_t = z_t.to(tl.int32, bitcast=True)
        kept_t = (tl.where(b_t < 0, b_t ^ 0x7FFFFFFF, b_t).to(tl.int64) > thr_key).to(tl.float32)
        tl.store(keptt_ptr + row, kept_t)

    # pass 3: sums without the target column
    acc_s = tl.zeros([BLOCK], tl.float32)
    acc_sy = tl.zeros([BLOCK], tl.float32)
    acc_sc = tl.zeros([BLOCK], tl.float32)
    acc_syc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        msk = offs < n_cols
        z = tl.load(base + offs, mask=msk, other=0.0)
        valid = msk & (offs != tgt)
        y = tl.where(valid, m - z, 0.0)
        e = tl.where(valid, tl.exp(-y), 0.0)
        acc_s += e
        acc_sy += e * y
        if HAS_CLAMP:
            bz = z.to(tl.int32, bitcast=True)
            kz = tl.where(bz < 0, bz ^ 0x7FFFFFFF, bz).to(tl.int64)
            ek = tl.where(kz > thr_key, e, 0.0)
            acc_sc += ek
            acc_syc += ek * y
    tl.store(s_ptr + row, tl.sum(acc_s, axis=0))
    tl.store(sy_ptr + row, tl.sum(acc_sy, axis=0))
    if HAS_CLAMP:
        tl.store(sc_ptr + row, tl.sum(acc_sc, axis=0))
        tl.store(syc_ptr + row, tl.sum(acc_syc, axis=0))


@triton.jit
def _grad_tile_kernel(
    z_ptr,
    stride_z,
    tgt_ptr,
    vocab_start,
    n_cols,
    m_ptr,
    neg_logs_ptr,
    a0_ptr,
    b0_ptr,
    thr_ptr,
    da_ptr,
    db_ptr,
    g_lp_ptr,
    om_ptr,
    g_h_ptr,
    ybar_ptr,
    g_cr_ptr,
    ybar_c_ptr,
    HAS_LP: tl.constexpr,
    HAS_H: tl.constexpr,
    HAS_CLAMP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    msk = offs < n_cols
    ptrs = z_ptr + row * stride_z + offs
    z = tl.load(ptrs, mask=msk, other=0.0)

    y = tl.load(m_ptr + row) - z
    p = tl.exp(tl.load(neg_logs_ptr + row) - y)
    c = tl.zeros([BLOCK], tl.float32) + tl.load(a0_ptr + row)
    rest = tl.zeros([BLOCK], tl.float32)  # the target entry's coefficient, without the log-prob term
    if HAS_H:
        b0 = tl.load(b0_ptr + row)
        c += b0 * y
        rest += tl.load(g_h_ptr + row) * (y - tl.load(ybar_ptr + row))
    if HAS_CLAMP:
        bz = z.to(tl.int32, bitcast=True)
        b_thr = tl.load(thr_ptr + row).to(tl.int32, bitcast=True)
        # compare in key order (the forward's order): int32 keys whose signed order is the float order
        kept = tl.where(bz < 0, bz ^ 0x7FFFFFFF, bz) > tl.where(b_thr < 0, b_thr ^ 0x7FFFFFFF, b_thr)
        c += tl.where(kept, tl.load(da_ptr + row) + tl.load(db_ptr + row) * y, 0.0)
        rest += tl.where(kept, tl.load(g_cr_ptr + row) * (y - tl.load(ybar_c_ptr + row)), 0.0)
    g = p * c
    g_t = p * rest
    if HAS_LP:
        # 1 - p_target = -expm1(log_prob), precomputed per token
        g_t += tl.load(g_lp_ptr + row) * tl.load(om_ptr + row)
    is_t = (offs + vocab_start) == tl.load(tgt_ptr + row)
    g = tl.where(is_t, g_t, g)
    tl.store(ptrs, g, mask=msk)


def _block(n_cols: int) -> int:
    return min(1024, max(16, triton.next_power_of_2(n_cols) // 2))


# (SEL_BLOCK, scratch entries per row) forced by tests; None: the defaults below.
SELECTION_OVERRIDE: tuple[int, int] | None = None


def _selection_config(block: int) -> dict[str, int]:
    return {"SEL_BLOCK": block if SELECTION_OVERRIDE is None else SELECTION_OVERRIDE[0]}


def scratch_per_row(vocab: int) -> int:
    """Entries of the selection's scratch buffer per row (the first bucket's candidates)."""
    if SELECTION_OVERRIDE is not None:
        return SELECTION_OVERRIDE[1]
    return -(-vocab // SCRATCH_FRACTION)


def forward_stats(z: torch.Tensor, targets: torch.Tensor, k: int, work: torch.Tensor | None = None):
    """Same outputs as `_torch_ops.forward_stats`; ``z`` is left unchanged. ``work``: with a clamp, an fp32 buffer of
    at least ``n * scratch_per_row(V)`` elements for the selection (allocated when None or smaller)."""
    n, vocab = z.shape
    f32 = dict(dtype=torch.float32, device=z.device)
    out = {name: torch.empty(n, **f32) for name in ("m", "y_t", "s_rest", "sy_rest")}
    if k > 0:
        out.update({name: torch.empty(n, **f32) for name in ("thr", "kept_t", "sc_rest", "syc_rest")})
    if n == 0:
        return out
    dummy = out["m"]
    per_row = scratch_per_row(vocab) if k > 0 else 0
    if k > 0 and (work is None or work.numel() < n * per_row):
        work = torch.empty(n * per_row, **f32)
    block = _block(vocab)
    _forward_stats_kernel[(n,)](
        z,
        z.stride(0),
        targets,
        vocab,
        k,
        work if k > 0 else dummy,
        per_row,
        out["m"],
        out["y_t"],
        out["s_rest"],
        out["sy_rest"],
        out.get("thr", dummy),
        out.get("kept_t", dummy),
        out.get("sc_rest", dummy),
        out.get("syc_rest", dummy),
        HAS_CLAMP=k > 0,
        BLOCK=block,
        **_selection_config(block),
    )
    return out


def grad_tile(z, vocab_start, targets, coef, work=None):
    """Same contract as `_torch_ops.grad_tile`; writes the gradient into ``z`` and returns it."""
    n, width = z.shape
    if n == 0 or width == 0:
        return z
    dummy = coef["m"]
    block = _block(width)
    has_clamp = "thr" in coef
    _grad_tile_kernel[(n, triton.cdiv(width, block))](
        z,
        z.stride(0),
        targets,
        vocab_start,
        width,
        coef["m"],
        coef["neg_logs"],
        coef["a0"],
        coef.get("b0", dummy),
        coef.get("thr", dummy),
        coef.get("da", dummy),
        coef.get("db", dummy),
        coef.get("g_lp", dummy),
        coef.get("om", dummy),
        coef.get("g_h", dummy),
        coef.get("ybar", dummy),
        coef.get("g_cr", dummy),
        coef.get("ybar_c", dummy),
        HAS_LP="g_lp" in coef,
        HAS_H="b0" in coef,
        HAS_CLAMP=has_clamp,
        BLOCK=block,
    )
    return z
