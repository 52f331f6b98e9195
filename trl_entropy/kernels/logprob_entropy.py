"""Chunked, fused LM-head log-prob / entropy / clamped entropy with a recomputing backward.

See ``docs/kernel.md`` for the formulas and the design. In short, with the raw logits scaled,
``y = (hidden @ weight.T + bias) * logit_scale``, soft-capped to ``c * tanh(y / c)`` when a cap ``c`` is given (as
TRL's fused head does it), and ``z = y / T``:

* ``log_probs[i] = z[i, t_i] - logsumexp(z[i])``
* ``entropy[i]   = H(softmax(z[i]))``
* ``clamped[i]   = H(softmax over the V - k largest entries of z[i])``, ``k = floor(clamp_fraction * V)``, or with
  ``top_p``, over SIREN's top-p set of the row (``_top_p.py``)

Rows (tokens) are processed ``chunk_size`` at a time; only one chunk of logits exists at any moment, forward or
backward. The forward keeps a few floats per token, and with a kept set (the clamp's or the top-p set) that set as
one bit per logit; the backward recomputes the logits in blocks of the same size as a chunk, taller where the chunk
allows (``_backward_blocks``), and reads the kept set from its bits.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from . import _torch_ops
from ._checks import check_chunk_size, check_options, check_target_ids, check_tensors, check_top_p
from ._top_p import TopPRule, top_p_stats


__all__ = [
    "ChunkedLogProbEntropyFunction",
    "LogitMap",
    "TopPRule",
    "chunked_logprob_entropy",
    "default_chunk_size",
    "triton_available",
]

# Bytes of fp32 logits per chunk (one buffer; the torch path keeps ~3 such buffers alive in the forward, ~4 in the
# backward). CPU: tuned on a 2-core machine (docs/kernel.md); CUDA: large enough for full-speed GEMMs.
CHUNK_BYTES_CPU = 64 << 20
CHUNK_BYTES_CUDA = 256 << 20
# Width of the vocabulary tiles when the weight must be upcast to fp32 for the matmul (bf16/fp16 weights without a
# matmul that writes fp32): bounds the fp32 copy of the weight tile.
UPCAST_TILE_BYTES = 32 << 20
# The backward's blocks where it need not recompute the forward's logits bit for bit (no kept set): up to 4096 tokens
# tall, so that each slice of the weight gradient is accumulated ceil(N / 4096) times, not once per forward chunk, and
# at least 4096 vocabulary entries wide where the buffer allows, so that narrow tiles do not multiply the hidden
# gradient's accumulations instead (TRL's head uses tiles of 4096 tokens by 32,768 entries).
BACKWARD_TOKEN_BLOCK = 4096
BACKWARD_MIN_WIDTH = 4096


# --------------------------------------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------------------------------------
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def _triton_ops():
    from . import _triton_ops

    return _triton_ops


def _resolve_backend(backend: str, device: torch.device) -> str:
    if backend == "torch":
        return "torch"
    if backend == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    # backend == "triton"
    if not triton_available():
        raise ValueError("backend='triton' was requested but triton is not importable; use backend='torch' or 'auto'")
    if device.type != "cuda":
        ops = _triton_ops()
        if not ops.INTERPRET:
            raise ValueError(
                f"backend='triton' on {device.type} tensors needs the Triton interpreter: set TRITON_INTERPRET=1 "
                "before the first Triton kernel is used in the process (or use backend='torch')"
            )
    return "triton"


# --------------------------------------------------------------------------------------------------------------------
# Matmuls with fp32 outputs, the logit map, the LM-head gather
# --------------------------------------------------------------------------------------------------------------------
_MM_OUT_DTYPE_OK: dict[str, bool] = {}


def _fast_half(t: torch.Tensor) -> bool:
    """bf16/fp16 CUDA operands multiplied with an fp32 output written in place (``out_dtype=torch.float32, out=``)."""
    if t.device.type != "cuda" or t.dtype not in (torch.bfloat16, torch.float16):
        return False
    key = str(t.dtype)
    if key not in _MM_OUT_DTYPE_OK:
        try:
            a = torch.zeros(2, 2, device=t.device, dtype=t.dtype)
            acc = torch.zeros(2, 2, device=t.device, dtype=torch.float32)
            torch.mm(a, a, out_dtype=torch.float32, out=acc)
            torch.addmm(acc, a, a, out_dtype=torch.float32, out=acc)
            _MM_OUT_DTYPE_OK[key] = True
        except (RuntimeError, TypeError):
            _MM_OUT_DTYPE_OK[key] = False
    return _MM_OUT_DTYPE_OK[key]


@dataclass(frozen=True)
class LogitMap:
    """The map from raw logits ``y = hidden @ weight.T + bias`` to the ``z`` that is softmaxed.

    ``z = c * tanh(s * y / c) / T`` with a soft-cap ``c``, ``z = s * y / T`` without (``s`` = ``logit_scale``).
    """

    logit_scale: float = 1.0
    softcap: float | None = None
    temperature: float = 1.0

    @property
    def gemm_scale(self) -> float:
        """Factor applied to ``y`` in the GEMM epilogue: gives the argument of tanh, or ``z`` when there is no cap."""
        return self.logit_scale / (self.softcap if self.softcap is not None else self.temperature)

    @property
    def grad_scale(self) -> float:
        """``dz/dy`` apart from the soft-cap's ``1 / cosh(u)**2``: ``s / T``."""
        return self.logit_scale / self.temperature


def _chunk_logits(h, w, b, logit_map, out, dtanh=None):
    """``z`` of one chunk (``logit_map`` applied to ``h @ w.T + b``) in fp32, with fp32 accumulation, written into
    ``out`` (n, w_rows). With a soft-cap and a ``dtanh`` buffer (the backward), also ``dtanh = 1 / cosh(u)**2``.

    ``h`` and ``w`` are fp32 here unless both are bf16/fp16 on CUDA with fp32-output matmuls (the caller upcasts).
    The same calls on buffers of the same shape give bit-identical ``z`` in the forward and the backward.
    """
    alpha = logit_map.gemm_scale
    if h.dtype == torch.float32 and w.dtype == torch.float32:
        if b is None:
            torch.mm(h, w.t(), out=out)
            if alpha != 1.0:
                out.mul_(alpha)
        else:
            torch.addmm(b, h, w.t(), beta=alpha, alpha=alpha, out=out)
    else:
        torch.mm(h, w.t(), out_dtype=torch.float32, out=out)
        if b is not None:
            out.add_(b)
        if alpha != 1.0:
            out.mul_(alpha)
    if logit_map.softcap is not None:
        if dtanh is not None:
            # tanh'(u) = 1 / cosh(u)^2, accurate where 1 - tanh(u)^2 cancels (cosh overflows to inf: exactly 0)
            torch.cosh(out, out=dtanh).reciprocal_().square_()
        out.tanh_().mul_(logit_map.softcap / logit_map.temperature)
    return out


def _accumulate_grads(g, h, w, grad_h, grad_w, grad_b, alpha, g_half):
    """``grad_h += alpha g @ w``, ``grad_w += alpha g.T @ h``, ``grad_b += alpha sum_rows(g)``, in place, fp32.

    ``g`` (n, width) is fp32, or on the bf16/fp16 CUDA path ``alpha g`` already rounded to ``w``'s dtype (then
    ``g_half`` is ``g`` itself and there is no ``grad_b``). ``g_half`` (a buffer of ``g``'s shape, ``w``'s dtype) is
    given on that path: ``alpha g`` is rounded into it and multiplied with fp32 output straight into the accumulators,
    so no temporary of an accumulator's size (``V x d`` for the weight) is ever allocated.
    """
    if grad_b is not None:
        grad_b.add_(g.sum(0), alpha=alpha)
    if g_half is None:
        if grad_h is not None:
            grad_h.addmm_(g, w, alpha=alpha)
        if grad_w is not None:
            grad_w.addmm_(g.t(), h, alpha=alpha)
        return
    if g is not g_half:
        g_half = torch.mul(g, alpha, out=g_half)
    if grad_h is not None:
        torch.addmm(grad_h, g_half, w, out_dtype=torch.float32, out=grad_h)
    if grad_w is not None:
        torch.addmm(grad_w, g_half.t(), h, out_dtype=torch.float32, out=grad_w)


def _gather_context(gather_parameters, weight, bias):
    """The caller's gather of sharded LM-head parameters (``gather_parameters(weight, bias)``, a context manager in
    which both are whole), or a null context when it passes none."""
    return contextlib.nullcontext() if gather_parameters is None else gather_parameters(weight, bias)


def default_chunk_size(n_tokens: int, vocab: int, device: torch.device | str = "cpu") -> int:
    budget = CHUNK_BYTES_CUDA if torch.device(device).type == "cuda" else CHUNK_BYTES_CPU
    return max(1, min(max(n_tokens, 1), budget // (4 * max(vocab, 1))))


def _vocab_tile(vocab: int, d: int, fast: bool, full_precision: bool) -> int:
    if full_precision or fast:
        return vocab
    return max(1, min(vocab, UPCAST_TILE_BYTES // (4 * max(d, 1))))


# --------------------------------------------------------------------------------------------------------------------
# Per-token formulas shared by both backends
# --------------------------------------------------------------------------------------------------------------------
def _log_sum_e(y_t: torch.Tensor, s_rest: torch.Tensor) -> torch.Tensor:
    """``log sum_a exp(z_a - m)`` of each row from its target's ``y_t`` and ``s_rest``: ``log1p((e_t - 1) + s_rest)``,
    exact when the target is the max (``p_t -> 1``)."""
    return torch.log1p(torch.expm1(-y_t) + s_rest)


def _finalize(stats: dict[str, torch.Tensor]):
    """Outputs and saved statistics from the raw row sums (all (n,) fp32). See docs/kernel.md, "Formulas". With a
    kept set (``thr`` in ``stats``: the clamp's or the top-p set), the third output is its entropy."""
    y_t = stats["y_t"]
    e_t = torch.exp(-y_t)
    em1 = torch.expm1(-y_t)  # e_t - 1, exact near the max
    s_rest = stats["s_rest"]
    logs = _log_sum_e(y_t, s_rest)
    ybar = (stats["sy_rest"] + e_t * y_t) / (e_t + s_rest)
    entropy = logs + ybar
    log_probs = -y_t - logs
    saved = {"m": stats["m"], "neg_logs": -logs, "ybar": ybar, "log_probs": log_probs}
    if "thr" in stats:
        kept_t = stats["kept_t"]
        sc_rest = stats["sc_rest"]
        logs_c = torch.where(kept_t > 0, torch.log1p(em1 + sc_rest), torch.log(sc_rest))
        ybar_c = (stats["syc_rest"] + kept_t * e_t * y_t) / (kept_t * e_t + sc_rest)
        clamped = logs_c + ybar_c
        if "kept_count" in stats:  # the top-p set may be empty (the clamp's never is): H = 0, with no gradient
            empty = stats["kept_count"] == 0
            clamped = clamped.masked_fill(empty, 0.0)
            # log sum_K e = +inf makes the backward's r = sum e / sum_K e exactly 0, hence every coefficient of the set
            logs_c = logs_c.masked_fill(empty, math.inf)
            ybar_c = ybar_c.masked_fill(empty, 0.0)
        saved.update(logs_c=logs_c, ybar_c=ybar_c)
    else:
        clamped = entropy.clone()
    return log_probs, entropy, clamped, saved


def _backward_coefficients(saved, g_lp, g_h, g_c):
    """Per-token coefficients of dL/dz = p * (a0 + b0 y) [+ kept * p * (da + db y)] (+ the target entry), and the
    kept set's bits (n, bytes) where the kept set enters the gradient."""
    if "kept_bits" not in saved and g_c is not None:  # no kept set: the third output is the entropy
        g_h = g_c if g_h is None else g_h + g_c
        g_c = None
    ybar = saved["ybar"]
    a0 = torch.zeros_like(ybar)
    coef = {"m": saved["m"], "neg_logs": saved["neg_logs"]}
    if g_lp is not None:
        coef["g_lp"] = g_lp
        coef["om"] = -torch.expm1(saved["log_probs"])  # 1 - p_target without cancellation
        a0 = a0 - g_lp
    if g_h is not None:
        coef["g_h"] = g_h
        coef["ybar"] = ybar
        coef["b0"] = g_h
        a0 = a0 - g_h * ybar
    if g_c is not None:
        # pi~_a = p_a * s / s_c: r = exp(log s - log s_c)
        g_cr = g_c * torch.exp(-saved["neg_logs"] - saved["logs_c"])
        coef.update(
            kept_bits=saved["kept_bits"], g_cr=g_cr, ybar_c=saved["ybar_c"], da=-g_cr * saved["ybar_c"], db=g_cr
        )
    coef["a0"] = a0
    return {name: t.contiguous() for name, t in coef.items()}


def _backward_blocks(n_tokens: int, vocab: int, chunk_size: int, tile: int) -> tuple[int, int]:
    """(tokens, vocabulary entries) of each block the backward recomputes, at most the forward's chunk of logits
    (``chunk_size x vocab`` entries): the forward's chunk and weight tile, or taller blocks.

    A recompute in blocks of another shape may round a logit differently in its last bit. That moves a gradient by a
    rounding only: a kept set comes from the forward's bits, not from the recomputed logits. So the blocks are up to
    ``BACKWARD_TOKEN_BLOCK`` tokens tall and at least ``BACKWARD_MIN_WIDTH`` wide where the budget allows (at most the
    weight tile ``tile``, a multiple of 256 entries where wider): the weight gradient, ``V x d`` fp32, is read and
    written once per token block instead of once per chunk.
    """
    budget = chunk_size * vocab
    rows = min(n_tokens, BACKWARD_TOKEN_BLOCK, budget // min(BACKWARD_MIN_WIDTH, vocab))
    if rows <= chunk_size:
        return chunk_size, tile
    width = min(tile, vocab, budget // rows)
    return rows, width - width % 256 if width >= 256 else width  # whole 256-column tiles for the GEMMs but the last


def _recompute_and_accumulate(ctx, ops, hidden, weight, bias, targets, coef_all, grad_h, grad_w, grad_b):
    """The backward's block loop: recompute each block's ``z``, turn it into ``dL/dy``, accumulate the gradients."""
    device, n_tokens, vocab = hidden.device, hidden.shape[0], weight.shape[0]
    logit_map = ctx.logit_map
    block_rows, block_width = _backward_blocks(n_tokens, vocab, ctx.chunk_size, ctx.tile)
    fast, full_precision = ctx.fast, ctx.full_precision
    bias32 = bias.float() if bias is not None else None
    rows_max = min(block_rows, n_tokens)
    numel = rows_max * min(block_width, vocab)
    zbuf = torch.empty(numel, device=device, dtype=torch.float32)
    work = torch.empty(3 * numel, device=device, dtype=torch.float32) if ctx.backend == "torch" else None
    dtanh_buf = torch.empty(numel, device=device, dtype=torch.float32) if logit_map.softcap is not None else None
    half_buf = torch.empty(numel, device=device, dtype=weight.dtype) if fast else None
    for r0 in range(0, n_tokens, block_rows):
        r1 = min(r0 + block_rows, n_tokens)
        n = r1 - r0
        h = hidden[r0:r1] if (full_precision or fast) else hidden[r0:r1].float()
        coef = {name: t[r0:r1] for name, t in coef_all.items()}
        tgt = targets[r0:r1]
        for v0 in range(0, vocab, block_width):
            v1 = min(v0 + block_width, vocab)
            width = v1 - v0
            w = weight[v0:v1] if (full_precision or fast) else weight[v0:v1].float()
            b = bias32[v0:v1] if bias32 is not None else None
            dtanh = dtanh_buf[: n * width].view(n, width) if dtanh_buf is not None else None
            z = _chunk_logits(h, w, b, logit_map, zbuf[: n * width].view(n, width), dtanh)
            g_half = half_buf[: n * width].view(n, width) if half_buf is not None else None
            if g_half is not None and grad_b is None:
                # alpha dL/dy rounded to the GEMMs' operand in the gradient's own pass (the bias gradient, when there
                # is one, sums the fp32 values instead)
                g = ops.grad_tile(z, v0, tgt, coef, work, dtanh, out=g_half, scale=logit_map.grad_scale)
            else:
                g = ops.grad_tile(z, v0, tgt, coef, work, dtanh)  # dL/dy
            _accumulate_grads(
                g,
                h,
                w,
                grad_h[r0:r1] if grad_h is not None else None,
                grad_w[v0:v1] if grad_w is not None else None,
                grad_b[v0:v1] if grad_b is not None else None,
                logit_map.grad_scale,
                g_half,
            )


# --------------------------------------------------------------------------------------------------------------------
# autograd.Function
# --------------------------------------------------------------------------------------------------------------------
class ChunkedLogProbEntropyFunction(torch.autograd.Function):
    """``apply(hidden, weight, bias, targets, logit_map, k, chunk_size, backend[, gather_parameters[, top_p]])`` ->
    (log_probs, entropy, clamped), and with ``top_p`` (log_probs, entropy, top_p_entropy, kept_count).

    ``logit_map`` is a :class:`LogitMap` (scale, soft-cap, temperature); ``k`` is the number of dropped entries per
    row; ``top_p`` None or a :class:`TopPRule` (then ``k`` is 0): the third output is the entropy of that set instead,
    and ``kept_count`` (no gradient) each row's set size; ``backend`` is ``"torch"`` or ``"triton"`` (already
    resolved). ``weight`` and ``bias`` are saved as given: when they are sharded parameters, the backward enters
    ``gather_parameters(weight, bias)`` (None: nothing) again for its recompute. The forward does not gather: its
    caller already holds them whole.
    """

    @staticmethod
    def forward(
        ctx, hidden, weight, bias, targets, logit_map, k, chunk_size, backend, gather_parameters=None, top_p=None
    ):
        ctx.set_materialize_grads(False)
        device = hidden.device
        n_tokens, d = hidden.shape
        vocab = weight.shape[0]
        ops = _triton_ops() if backend == "triton" else _torch_ops
        full_precision = hidden.dtype == torch.float32 and weight.dtype == torch.float32
        fast = not full_precision and _fast_half(weight) and hidden.dtype == weight.dtype
        tile = _vocab_tile(vocab, d, fast, full_precision)

        chunks: dict[str, list[torch.Tensor]] = {}
        with torch.autocast(device.type, enabled=False):
            bias32 = bias.float() if bias is not None else None
            rows_max = min(chunk_size, n_tokens)
            zbuf = torch.empty(rows_max * vocab, device=device, dtype=torch.float32)
            # upcast tiles are computed in a contiguous buffer of the tile's shape (a column slice of the chunk is
            # not one) and copied into the chunk
            tile_buf = torch.empty(rows_max * tile, device=device, dtype=torch.float32) if tile < vocab else None
            if backend == "torch":
                work = torch.empty(2 * zbuf.numel(), device=device, dtype=torch.float32)
            else:  # the selection's scratch rows (none without a clamp)
                scratch = rows_max * ops.scratch_per_row(vocab) if k > 0 else 0
                work = torch.empty(scratch, device=device, dtype=torch.float32)
            # the kept set, one bit per logit, for the backward (the clamp's or the top-p set)
            kept_set = k > 0 or top_p is not None
            kept_bytes = _torch_ops.kept_bytes(vocab)
            kept_bits = torch.empty(n_tokens if kept_set else 0, kept_bytes, device=device, dtype=torch.uint8)
            for r0 in range(0, n_tokens, chunk_size):
                r1 = min(r0 + chunk_size, n_tokens)
                n = r1 - r0
                h = hidden[r0:r1] if (full_precision or fast) else hidden[r0:r1].float()
                z = zbuf[: n * vocab].view(n, vocab)
                for v0 in range(0, vocab, tile):
                    v1 = min(v0 + tile, vocab)
                    w = weight[v0:v1] if (full_precision or fast) else weight[v0:v1].float()
                    b = bias32[v0:v1] if bias32 is not None else None
                    if tile_buf is None:
                        _chunk_logits(h, w, b, logit_map, z)
                    else:
                        z[:, v0:v1] = _chunk_logits(h, w, b, logit_map, tile_buf[: n * (v1 - v0)].view(n, v1 - v0))
                bits = kept_bits[r0:r1] if k > 0 else None
                stats = ops.forward_stats(z, targets[r0:r1], k, work, bits)  # without a clamp, z is left unchanged
                if top_p is not None:
                    log_sum_e = _log_sum_e(stats["y_t"], stats["s_rest"])
                    stats.update(top_p_stats(z, targets[r0:r1], stats["m"], log_sum_e, top_p))
                    _torch_ops.pack_kept(_torch_ops.kept_mask(z, stats["thr"]), kept_bits[r0:r1])
                for name, value in stats.items():
                    chunks.setdefault(name, []).append(value)
            names = ("m", "y_t", "s_rest", "sy_rest")
            if k > 0 or top_p is not None:
                names += ("thr", "kept_t", "sc_rest", "syc_rest")
            if top_p is not None:
                names += ("kept_count",)
            stats_all = {
                name: torch.cat(chunks[name]) if name in chunks else torch.empty(0, device=device) for name in names
            }
            log_probs, entropy, clamped, saved = _finalize(stats_all)
            if kept_set:
                saved["kept_bits"] = kept_bits

        ctx.logit_map = logit_map
        ctx.chunk_size = chunk_size
        ctx.backend = backend
        ctx.tile = tile
        ctx.fast = fast
        ctx.full_precision = full_precision
        ctx.gather_parameters = gather_parameters
        ctx.saved_names = tuple(saved)
        ctx.save_for_backward(hidden, weight, bias, targets, *saved.values())
        if top_p is None:
            return log_probs, entropy, clamped
        kept_count = stats_all["kept_count"]
        ctx.mark_non_differentiable(kept_count)
        return log_probs, entropy, clamped, kept_count

    @staticmethod
    @once_differentiable
    def backward(ctx, g_lp, g_h, g_c, *_kept_count_grad):
        hidden, weight, bias, targets, *saved_values = ctx.saved_tensors
        saved = dict(zip(ctx.saved_names, saved_values))
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        no_grads = (None,) * 7
        if (g_lp is None and g_h is None and g_c is None) or not (need_h or need_w or need_b):
            return (None,) * 3 + no_grads
        g_lp = g_lp.float() if g_lp is not None else None
        g_h = g_h.float() if g_h is not None else None
        g_c = g_c.float() if g_c is not None else None
        device = hidden.device
        ops = _triton_ops() if ctx.backend == "triton" else _torch_ops

        # Under ZeRO-3 the head was re-partitioned after the forward: the recompute needs it whole again.
        with _gather_context(ctx.gather_parameters, weight, bias), torch.autocast(device.type, enabled=False):
            vocab = weight.shape[0]
            coef_all = _backward_coefficients(saved, g_lp, g_h, g_c)
            grad_h = torch.zeros(hidden.shape, device=device, dtype=torch.float32) if need_h else None
            grad_w = torch.zeros(weight.shape, device=device, dtype=torch.float32) if need_w else None
            grad_b = torch.zeros(vocab, device=device, dtype=torch.float32) if need_b else None
            # the chunk buffers are freed when this returns, before the casts below allocate the gradients in the
            # inputs' dtypes
            _recompute_and_accumulate(ctx, ops, hidden, weight, bias, targets, coef_all, grad_h, grad_w, grad_b)

        return (
            grad_h.to(hidden.dtype) if grad_h is not None else None,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if grad_b is not None else None,
            *no_grads,
        )


# --------------------------------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------------------------------
def chunked_logprob_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    clamp_fraction: float = 0.0,
    chunk_size: int | None = None,
    backend: str = "auto",
    logit_scale: float = 1.0,
    final_logit_softcapping: float | None = None,
    gather_parameters: Callable[[torch.Tensor, torch.Tensor | None], AbstractContextManager] | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    include_crossing: bool = False,
    return_kept_count: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Per-token log-prob of ``targets``, entropy and clamped (or top-p) entropy of ``softmax(z)``, with ``z`` the LM
    head's logits as TRL's fused head computes them: ``y = (hidden @ weight.T + bias) * logit_scale``, soft-capped to
    ``c * tanh(y / c)`` when ``final_logit_softcapping = c`` is given, then divided by the temperature.

    Args:
        hidden: ``(N, d)`` final hidden states of the scored positions (any float dtype).
        weight: ``(V, d)`` LM-head weight.
        targets: ``(N,)`` token ids in ``[0, V)`` (any integer dtype).
        bias: optional ``(V,)`` LM-head bias.
        temperature: sampling temperature ``T > 0``; logits are divided by it.
        clamp_fraction: ``p`` in ``[0, 1)``; the clamped entropy drops the ``floor(p * V)`` smallest logits per row.
        chunk_size: tokens per chunk (default: ~64 MiB of fp32 logits per chunk on CPU, ~256 MiB on CUDA).
        backend: ``"auto"`` (Triton on CUDA tensors when importable, PyTorch otherwise), ``"torch"`` or ``"triton"``.
        logit_scale: finite factor on the raw logits (``logit_scale``, ``output_multiplier``, ``1 / logits_scaling``
            of the model config, read the way TRL reads them); 0 is allowed (uniform distribution).
        final_logit_softcapping: ``None`` or the soft-cap ``c > 0`` (Gemma-2 style), applied before the temperature.
            The clamp drops the same tokens as without it (the map is monotone); it is computed on ``z``.

        gather_parameters: ``None`` (the parameters are whole) or a callable ``(weight, bias) -> context manager``
            inside which sharded ``weight``/``bias`` (ZeRO-3) are whole. It is entered while the kernel reads them:
            in the forward and again in the recomputing backward (ZeRO-3 re-partitions them after the forward). It
            receives ``weight`` and ``bias`` as passed (``bias`` may be None); choosing what to gather is the caller's
            business (for example only ``torch.nn.Parameter``s, not copies it converted).
        top_p: ``None`` or SIREN's mass ``p`` in ``(0, 1]`` (arXiv:2509.25133): the third output is then the entropy
            of the softmax renormalised over the top-p set of each row: its largest logits, in rank order, while the
            cumulative mass of the full softmax stays below ``p`` (the token whose mass crosses ``p`` is left out),
            within the ``top_k`` largest; 0, with no gradient, where that set is empty (the largest probability
            ``>= p``). Needs ``clamp_fraction == 0``. See docs/kernel.md, "Per-row thresholds".
        top_k: with ``top_p``, ``None`` (the whole row) or an int ``>= 1``: the set is within the ``top_k`` largest.
        include_crossing: with ``top_p``, also keep the token whose mass crosses ``p`` (the standard nucleus; the set
            is then never empty).
        return_kept_count: with ``top_p``, also return each row's set size ``|S|``.

    Returns:
        ``(log_probs, entropy, clamped_entropy)``, each ``(N,)`` fp32, differentiable w.r.t. ``hidden``, ``weight``
        and ``bias`` whichever of them enter the loss. With ``clamp_fraction == 0`` the clamped entropy equals the
        entropy (same numbers, its gradient is the entropy's); with ``top_p`` it is the top-p set's entropy. With
        ``return_kept_count=True`` a fourth tensor follows: ``(N,)`` fp32, each row's top-p set size, no gradient.
    """
    clamp_fraction, temperature, logit_scale, final_logit_softcapping = check_options(
        clamp_fraction, temperature, backend, logit_scale, final_logit_softcapping, gather_parameters
    )
    top_p, top_k = check_top_p(top_p, top_k, include_crossing, clamp_fraction, return_kept_count)
    rule = None if top_p is None else TopPRule(top_p, top_k, include_crossing)
    logit_map = LogitMap(logit_scale, final_logit_softcapping, temperature)
    with _gather_context(gather_parameters, weight, bias):  # validated and multiplied whole
        check_tensors(hidden, weight, targets, bias)
        n_tokens, vocab = hidden.shape[0], weight.shape[0]
        if chunk_size is None:
            chunk_size = default_chunk_size(n_tokens, vocab, hidden.device)
        else:
            check_chunk_size(chunk_size)
        targets = targets.long()
        check_target_ids(targets, vocab)
        resolved = _resolve_backend(backend, hidden.device)
        k = int(math.floor(clamp_fraction * vocab))
        outputs = ChunkedLogProbEntropyFunction.apply(
            hidden.contiguous(),
            weight.contiguous(),
            bias,
            targets.contiguous(),
            logit_map,
            k,
            chunk_size,
            resolved,
            gather_parameters,
            rule,
        )
        return outputs if return_kept_count or rule is None else outputs[:3]
