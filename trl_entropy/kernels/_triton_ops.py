"""Triton implementation of the per-chunk work (same contract as `_torch_ops.py`).

Imported lazily, on the first call with ``backend="triton"`` (or ``"auto"`` on a CUDA tensor). Triton reads
``TRITON_INTERPRET`` when the kernels below are decorated, i.e. when this module is first imported: to run them on
CPU tensors, set ``TRITON_INTERPRET=1`` before the first Triton call in the process.

Kernels
-------
``_forward_stats_kernel``, one program per token (row of the chunk's logits, which cuBLAS wrote in fp32). fp32 values
are compared as int32 sort keys whose integer order is the float order (negative floats get their 31 low bits flipped).

0. with a clamp, a strided sample of ``SAMPLE`` entries, ranked by pairwise comparison and written sorted to the row's
   scratch: the window ``(lo, hi]`` is ``window_span`` sample ranks on each side of the k-th smallest's expected place;
1. one streaming pass for the row max and the target logit; with a clamp, the same pass counts the entries ``<= lo``
   and writes the window's entries, in row order, to the scratch row (while they fit);
2. with a clamp, the k-th smallest key, exactly: a bracket ``(a, b]`` holding it narrows round by round, each round
   counting the entries ``<=`` each of ``PROBES`` keys inside it, until ``b = a + 1``. It starts as the window, read
   from the scratch row, with probes at evenly spaced sample ranks; later rounds probe evenly spaced keys, and once
   the bracket holds at most ``BRACKET`` entries they are copied to the scratch row's bracket area (after the window)
   and only those are read. A row whose window missed the k-th smallest or overflowed starts from every key up to the
   max and reads the whole row. The sizes are ``SELECTION`` (``SelectionSizes``);
3. one streaming pass for ``sum exp(-y)`` and ``sum exp(-y) * y`` (``y = m - z``) without the target column, and the
   same over kept entries (``key(z) > key(thr)``); with a clamp, the same pass writes the kept set as bits, one per
   entry (the layout of ``_torch_ops.pack_kept``).

``_grad_tile_kernel``, one program per (token, block of columns): recomputes ``p`` from the saved row statistics and
overwrites the logits block with ``dL/dy`` (the gradient GEMMs then run in torch/cuBLAS), or writes it scaled and
rounded to the GEMMs' half-precision operand; the kept set is the forward's, read from its bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton import knobs


INTERPRET = bool(knobs.runtime.interpret)


@dataclass(frozen=True)
class SelectionSizes:
    """The clamp's selection sizes (one set per process: the module's ``SELECTION``, which benchmarks and tests may
    replace). The defaults: at k = 0.3 V the window is ~17 % of the row, a first round's bracket ~0.5 % (~790 entries
    at V = 151,936)."""

    sample: int = 512  # entries of the strided sample (a power of two)
    rank_block: int = 8  # sampled entries compared per step of the sample's ranks (a power of two)
    span_sigmas: float = 4.0  # the window's half-width in standard deviations of a sample quantile's rank
    window_fraction: int = 4  # the scratch row holds up to V / window_fraction of the window's entries
    probes: int = 32  # keys counted per round (a power of two)
    probe_block: int = 64  # entries per step of a round: a (probe_block, probes) int32 count per program
    bracket: int = 4096  # entries of a bracket copied out of the window (after it in the scratch row), at most
    sel_block: int | None = None  # entries per step of the bracket's copy; None: the vocabulary block (`_block`)
    window_cap: int | None = None  # the window's room per row; None: ceil(V / window_fraction)
    num_warps: int = 4  # warps per program (per row) of the statistics kernel with a clamp


SELECTION = SelectionSizes()

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
    span,
    scratch_ptr,
    scratch_per_row,
    window_cap,
    m_ptr,
    yt_ptr,
    s_ptr,
    sy_ptr,
    thr_ptr,
    keptt_ptr,
    sc_ptr,
    syc_ptr,
    bits_ptr,
    stride_bits,
    HAS_CLAMP: tl.constexpr,
    BLOCK: tl.constexpr,
    SEL_BLOCK: tl.constexpr,
    SAMPLE: tl.constexpr,
    RANK_BLOCK: tl.constexpr,
    PROBES: tl.constexpr,
    PROBE_BLOCK: tl.constexpr,
    BRACKET: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = z_ptr + row * stride_z
    tgt = tl.load(tgt_ptr + row).to(tl.int64)
    window_row = scratch_ptr + row * scratch_per_row
    bracket_row = window_row + window_cap
    sample_row = bracket_row + BRACKET

    # step 0 (clamp): a strided sample of the row, sorted into the scratch row by each entry's rank in it (ties by
    # position); the window (lo, hi] lies `span` sample ranks on each side of the k-th smallest's expected place
    lo = tl.full([], -2147483648, tl.int32)  # below every non-NaN key
    hi = tl.full([], 2147483647, tl.int32)  # above every non-NaN key
    r_lo = tl.full([], 0, tl.int64)
    r_hi = tl.full([], 0, tl.int64)
    if HAS_CLAMP:
        s_pos = tl.arange(0, SAMPLE)
        s = tl.load(base + (s_pos.to(tl.int64) * n_cols) // SAMPLE)
        sb = s.to(tl.int32, bitcast=True)
        s_key = tl.where(sb < 0, sb ^ 0x7FFFFFFF, sb)
        s_rank = tl.zeros([SAMPLE], tl.int32)
        for j0 in range(0, SAMPLE, RANK_BLOCK):
            j = j0 + tl.arange(0, RANK_BLOCK)
            bj = tl.load(base + (j.to(tl.int64) * n_cols) // SAMPLE).to(tl.int32, bitcast=True)
            kj = tl.where(bj < 0, bj ^ 0x7FFFFFFF, bj)
            ahead = (kj[None, :] < s_key[:, None]) | ((kj[None, :] == s_key[:, None]) & (j[None, :] < s_pos[:, None]))
            s_rank += tl.sum(ahead.to(tl.int32), axis=1)
        tl.store(sample_row + s_rank, s)
        tl.debug_barrier()  # the scratch row's entries, stored by some of the program's threads, are read by others
        centre = ((2 * k.to(tl.int64) - 1) * SAMPLE) // (2 * n_cols)  # the (k - 1/2) / V quantile's sample rank
        r_lo = centre - span
        r_hi = centre + span
        b_lo = tl.load(sample_row + tl.maximum(r_lo, 0)).to(tl.int32, bitcast=True)
        b_hi = tl.load(sample_row + tl.minimum(r_hi, SAMPLE - 1)).to(tl.int32, bitcast=True)
        lo = tl.where(r_lo >= 0, tl.where(b_lo < 0, b_lo ^ 0x7FFFFFFF, b_lo), lo)
        hi = tl.where(r_hi < SAMPLE, tl.where(b_hi < 0, b_hi ^ 0x7FFFFFFF, b_hi), hi)

    # pass 1: max and target; with a clamp, count(key <= lo) and the window's entries, in row order, into the scratch
    # row while they fit
    vmax = tl.full([BLOCK], -float("inf"), tl.float32)
    n_below = tl.zeros([BLOCK], tl.int32)
    n_window = tl.full([], 0, tl.int32)
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        msk = offs < n_cols
        z = tl.load(base + offs, mask=msk, other=-float("inf"))
        vmax = tl.maximum(vmax, z)
        if HAS_CLAMP:
            bz = z.to(tl.int32, bitcast=True)
            kz = tl.where(bz < 0, bz ^ 0x7FFFFFFF, bz)
            n_below += (msk & (kz <= lo)).to(tl.int32)
            inside = msk & (kz > lo) & (kz <= hi)
            inside32 = inside.to(tl.int32)
            slot = n_window + tl.cumsum(inside32, axis=0) - 1
            tl.store(window_row + slot, z, mask=inside & (slot < window_cap))
            n_window += tl.sum(inside32, axis=0)
    m = tl.max(vmax, axis=0)
    z_t = tl.load(base + tgt)
    y_t = m - z_t
    tl.store(m_ptr + row, m)
    tl.store(yt_ptr + row, y_t)

    thr_key = tl.full([], 0, tl.int64)
    if HAS_CLAMP:
        b_max = m.to(tl.int32, bitcast=True)
        key_max = tl.where(b_max < 0, b_max ^ 0x7FFFFFFF, b_max).to(tl.int64)
        below_lo = tl.sum(n_below, axis=0)
        in_window = (below_lo < k) & (k <= below_lo + n_window) & (n_window <= window_cap)
        # step 2: narrow a bracket (a, b] with count(key <= a) = le_a < k <= le_b = count(key <= b) until b = a + 1:
        # each round counts, over a source holding every entry of the bracket, the entries <= each of PROBES keys
        # inside it. The window's first round probes at evenly spaced sample ranks (they follow the row's
        # distribution), the other rounds at evenly spaced keys. Once the bracket fits its area its entries are
        # copied there, and the rounds read only those. A row whose window missed the k-th smallest, or overflowed,
        # narrows from (below every key, max] over the whole row, its first probes spread over the whole sample.
        j = tl.arange(0, PROBES)
        at = tl.where(in_window, r_lo + ((r_hi - r_lo) * (j + 1)) // (PROBES + 1), (SAMPLE * (j + 1)) // (PROBES + 1))
        bp = tl.load(sample_row + tl.minimum(tl.maximum(at, 0), SAMPLE - 1)).to(tl.int32, bitcast=True)
        pts = tl.where(bp < 0, bp ^ 0x7FFFFFFF, bp).to(tl.int64)
        pts = tl.where((at >= 0) & (at < SAMPLE), pts, tl.where(at < 0, lo, hi).to(tl.int64))
        a = tl.where(in_window, lo, -2147483648).to(tl.int64)
        b = tl.where(in_window, hi.to(tl.int64), key_max)
        le_a = tl.where(in_window, below_lo, 0)
        le_b = tl.where(in_window, below_lo + n_window, n_cols)
        if in_window:
            src = window_row
        else:
            src = base
        n_src = le_b - le_a
        in_bracket_area = tl.full([], 0, tl.int32)
        tl.debug_barrier()  # the scratch row's entries, stored by some of the program's threads, are read by others
        while b - a > 1:
            # keys are int32; the bracket's ends and probes are int64 for the arithmetic only
            a32 = a.to(tl.int32)
            pts32 = pts.to(tl.int32)
            n_le = tl.zeros([PROBE_BLOCK, PROBES], tl.int32)
            for start in range(0, n_src, PROBE_BLOCK):
                offs = start + tl.arange(0, PROBE_BLOCK)
                bw = tl.load(src + offs, mask=offs < n_src, other=0.0).to(tl.int32, bitcast=True)
                kw = tl.where(bw < 0, bw ^ 0x7FFFFFFF, bw)
                inside = (offs < n_src) & (kw > a32)
                n_le += ((kw[:, None] <= pts32[None, :]) & inside[:, None]).to(tl.int32)
            le = le_a + tl.sum(n_le, axis=0)
            a = tl.maximum(a, tl.max(tl.where(le < k, pts, a), axis=0))
            le_a = tl.maximum(le_a, tl.max(tl.where(le < k, le, le_a), axis=0))
            b = tl.minimum(b, tl.min(tl.where(le >= k, pts, b), axis=0))
            le_b = tl.minimum(le_b, tl.min(tl.where(le >= k, le, le_b), axis=0))
            if (in_bracket_area == 0) & (le_b - le_a <= BRACKET) & (b - a > 1):
                n_copied = tl.full([], 0, tl.int32)
                for start in range(0, n_src, SEL_BLOCK):
                    offs = start + tl.arange(0, SEL_BLOCK)
                    w = tl.load(src + offs, mask=offs < n_src, other=0.0)
                    bw = w.to(tl.int32, bitcast=True)
                    kw = tl.where(bw < 0, bw ^ 0x7FFFFFFF, bw)
                    inb = (offs < n_src) & (kw > a.to(tl.int32)) & (kw <= b.to(tl.int32))
                    inb32 = inb.to(tl.int32)
                    slot = n_copied + tl.cumsum(inb32, axis=0) - 1
                    tl.store(bracket_row + slot, w, mask=inb)
                    n_copied += tl.sum(inb32, axis=0)
                tl.debug_barrier()
                src = bracket_row
                n_src = le_b - le_a
                in_bracket_area = 1
            pts = a + ((b - a) * (j + 1)) // (PROBES + 1)
        # keep at least the max, even when the whole row ties
        thr_key = tl.minimum(b, key_max - 1)
        thr_bits = tl.where(thr_key < 0, thr_key ^ 0x7FFFFFFF, thr_key).to(tl.int32)
        tl.store(thr_ptr + row, thr_bits.to(tl.float32, bitcast=True))
        b_t = z_t.to(tl.int32, bitcast=True)
        kept_t = (tl.where(b_t < 0, b_t ^ 0x7FFFFFFF, b_t).to(tl.int64) > thr_key).to(tl.float32)
        tl.store(keptt_ptr + row, kept_t)

    # pass 3: sums without the target column; with a clamp, the kept set's bits (BLOCK is a multiple of 8, so each
    # block fills whole bytes)
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
            kept = msk & (kz > thr_key)
            ek = tl.where(kept, e, 0.0)
            acc_sc += ek
            acc_syc += ek * y
            bit = kept.to(tl.int32) << (tl.arange(0, BLOCK) % 8)
            packed = tl.xor_sum(tl.reshape(bit, [BLOCK // 8, 8]), axis=1)  # distinct bits: the sum is their OR
            byte = start // 8 + tl.arange(0, BLOCK // 8)
            tl.store(bits_ptr + row * stride_bits + byte, packed.to(tl.uint8), mask=byte < (n_cols + 7) // 8)
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
    bits_ptr,
    stride_bits,
    da_ptr,
    db_ptr,
    g_lp_ptr,
    om_ptr,
    g_h_ptr,
    ybar_ptr,
    g_cr_ptr,
    ybar_c_ptr,
    dtanh_ptr,
    stride_dtanh,
    out_ptr,
    stride_out,
    scale,
    HAS_LP: tl.constexpr,
    HAS_H: tl.constexpr,
    HAS_CLAMP: tl.constexpr,
    HAS_DTANH: tl.constexpr,
    OUT_BF16: tl.constexpr,
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
        col = offs + vocab_start
        byte = tl.load(bits_ptr + row * stride_bits + col // 8, mask=msk, other=0).to(tl.int32)
        kept = ((byte >> (col % 8)) & 1) != 0
        c += tl.where(kept, tl.load(da_ptr + row) + tl.load(db_ptr + row) * y, 0.0)
        rest += tl.where(kept, tl.load(g_cr_ptr + row) * (y - tl.load(ybar_c_ptr + row)), 0.0)
    g = p * c
    g_t = p * rest
    if HAS_LP:
        # 1 - p_target = -expm1(log_prob), precomputed per token
        g_t += tl.load(g_lp_ptr + row) * tl.load(om_ptr + row)
    is_t = (offs + vocab_start) == tl.load(tgt_ptr + row)
    g = tl.where(is_t, g_t, g)
    if HAS_DTANH:  # the soft-cap's 1 / cosh(u)^2 (dL/dz -> dL/dy): one fp32 product, rounded as torch's would be
        g = g * tl.load(dtanh_ptr + row * stride_dtanh + offs, mask=msk, other=0.0)
    g = g * scale  # 1.0 (exact) unless the output is the GEMMs' bf16 operand
    if OUT_BF16:
        # round to nearest even on the bits, as torch rounds fp32 to bf16 (NaN to the quiet NaN), so that the bits
        # are the same on a GPU and under the interpreter, whose float conversions truncate
        bits = g.to(tl.int32, bitcast=True)
        half = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
        half = tl.where(g != g, 0x7FC0, half)
        tl.store(out_ptr + row * stride_out + offs, half.to(tl.int16).to(tl.bfloat16, bitcast=True), mask=msk)
    else:
        tl.store(out_ptr + row * stride_out + offs, g, mask=msk)


def _block(n_cols: int) -> int:
    return min(1024, max(16, triton.next_power_of_2(n_cols) // 2))  # a multiple of 8: whole bytes of kept bits


def _window_cap(vocab: int) -> int:
    return SELECTION.window_cap if SELECTION.window_cap is not None else -(-vocab // SELECTION.window_fraction)


def _selection_config(vocab: int) -> dict[str, int]:
    s = SELECTION
    return dict(
        SEL_BLOCK=s.sel_block if s.sel_block is not None else _block(vocab),
        SAMPLE=s.sample,
        RANK_BLOCK=s.rank_block,
        PROBES=s.probes,
        PROBE_BLOCK=s.probe_block,
        BRACKET=s.bracket,
    )


def scratch_per_row(vocab: int) -> int:
    """Entries of the selection's scratch buffer per row: the window, the bracket and the sorted sample."""
    return _window_cap(vocab) + SELECTION.bracket + SELECTION.sample


def window_span(k: int, vocab: int) -> int:
    """Sample ranks on each side of the k-th smallest's expected place that the window spans: ``span_sigmas``
    standard deviations of a sample quantile's rank (binomial), and two more."""
    q = k / vocab
    return math.ceil(SELECTION.span_sigmas * math.sqrt(SELECTION.sample * q * (1 - q))) + 2


def forward_stats(
    z: torch.Tensor,
    targets: torch.Tensor,
    k: int,
    work: torch.Tensor | None = None,
    kept_bits: torch.Tensor | None = None,
):
    """Same outputs as `_torch_ops.forward_stats`; ``z`` is left unchanged. ``work``: with a clamp, an fp32 buffer of
    at least ``n * scratch_per_row(V)`` elements for the selection (allocated when None or smaller). ``kept_bits``:
    with a clamp, where the kept set's bits go (n, ``_torch_ops.kept_bytes(V)``) uint8, row stride free (a scratch
    one when None)."""
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
    if k > 0 and kept_bits is None:
        kept_bits = torch.empty(n, (vocab + 7) // 8, dtype=torch.uint8, device=z.device)
    _forward_stats_kernel[(n,)](
        z,
        z.stride(0),
        targets,
        vocab,
        k,
        window_span(k, vocab) if k > 0 else 0,
        work if k > 0 else dummy,
        per_row,
        _window_cap(vocab),
        out["m"],
        out["y_t"],
        out["s_rest"],
        out["sy_rest"],
        out.get("thr", dummy),
        out.get("kept_t", dummy),
        out.get("sc_rest", dummy),
        out.get("syc_rest", dummy),
        kept_bits if k > 0 else dummy,
        kept_bits.stride(0) if k > 0 else 0,
        HAS_CLAMP=k > 0,
        BLOCK=_block(vocab),
        **_selection_config(vocab),
        num_warps=SELECTION.num_warps if k > 0 else 4,
    )
    return out


def grad_tile(z, vocab_start, targets, coef, work=None, dtanh=None, out=None, scale=1.0):
    """Same contract as `_torch_ops.grad_tile`; writes the gradient into ``z`` (or a bf16 ``out``, in the same pass)
    and returns it."""
    n, width = z.shape
    if out is not None and out.dtype != torch.bfloat16:  # fp16: torch's product rounds it
        return torch.mul(grad_tile(z, vocab_start, targets, coef, work, dtanh), scale, out=out)
    if out is None:
        out, scale = z, 1.0
    if n == 0 or width == 0:
        return out
    dummy = coef["m"]
    block = _block(width)
    has_clamp = "kept_bits" in coef
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
        coef.get("kept_bits", dummy),
        coef["kept_bits"].stride(0) if has_clamp else 0,
        coef.get("da", dummy),
        coef.get("db", dummy),
        coef.get("g_lp", dummy),
        coef.get("om", dummy),
        coef.get("g_h", dummy),
        coef.get("ybar", dummy),
        coef.get("g_cr", dummy),
        coef.get("ybar_c", dummy),
        dtanh if dtanh is not None else dummy,
        dtanh.stride(0) if dtanh is not None else 0,
        out,
        out.stride(0),
        float(scale),
        HAS_LP="g_lp" in coef,
        HAS_H="b0" in coef,
        HAS_CLAMP=has_clamp,
        HAS_DTANH=dtanh is not None,
        OUT_BF16=out.dtype == torch.bfloat16,
        BLOCK=block,
    )
    return out
