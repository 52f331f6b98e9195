"""The fused chunked log-prob / entropy / clamped-entropy kernel (PyTorch path) against float64 references."""

import ast
import contextlib
import functools
import itertools
import math
from pathlib import Path

import pytest
import torch
from _reference.cpu_emulation import TensorAllocations, emulate_fp32_output_gemm
from _reference.float64_reference import kernel_inputs, reference
from _reference.grad_tile_rounding import check_grad_tile_rounds_like_torch
from _reference.kernel_reference import naive_logprob_entropy

import trl_entropy.kernels.logprob_entropy as lpe
from trl_entropy.kernels import _torch_ops, chunked_logprob_entropy
from trl_entropy.kernels._select import kth_smallest_threshold


N, D, V = 23, 16, 301  # V is not a multiple of anything the kernel tiles by
OUTPUTS = ("log_probs", "entropy", "clamped_entropy")
REFERENCE_KWARGS = ("temperature", "clamp_fraction", "logit_scale", "final_logit_softcapping")


# ---------------------------------------------------------------------------------------------------------------------
# Independent float64 reference
# ---------------------------------------------------------------------------------------------------------------------
make_inputs = functools.partial(kernel_inputs, n=N, d=D, vocab=V)


def run_both(hidden, weight, bias, targets, *, used=OUTPUTS, seed=1, **kwargs):
    """Outputs and gradients of the kernel and of the float64 reference for loss = sum_o <w_o, out_o> over ``used``."""
    g = torch.Generator().manual_seed(seed)
    loss_weights = {name: torch.randn(hidden.shape[0], generator=g, dtype=torch.float64) for name in OUTPUTS}

    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (hidden, weight, bias)]
    out = chunked_logprob_entropy(leaves[0], leaves[1], targets, bias=leaves[2], **kwargs)
    loss = sum((out[OUTPUTS.index(name)].double() * loss_weights[name]).sum() for name in used)
    loss.backward()
    grads = [t.grad if t is not None else None for t in leaves]

    ref_leaves = [t.detach().double().requires_grad_() if t is not None else None for t in (hidden, weight, bias)]
    ref_kwargs = {k: v for k, v in kwargs.items() if k in REFERENCE_KWARGS}
    ref = reference(ref_leaves[0], ref_leaves[1], targets, bias=ref_leaves[2], **ref_kwargs)
    ref_loss = sum((ref[OUTPUTS.index(name)] * loss_weights[name]).sum() for name in used)
    ref_loss.backward()
    ref_grads = [t.grad if t is not None else None for t in ref_leaves]
    return out, grads, ref, ref_grads


def assert_values(out, ref, rtol=1e-5):
    for name, a, b in zip(OUTPUTS, out, ref):
        assert a.dtype == torch.float32 and a.shape == b.shape, name
        torch.testing.assert_close(a.double(), b.detach(), rtol=rtol, atol=rtol * b.abs().max().item(), msg=name)


def assert_grads(grads, ref_grads, inputs, rtol=1e-5):
    for name, g, r, x in zip(("hidden", "weight", "bias"), grads, ref_grads, inputs):
        if x is None:
            continue
        assert g is not None, f"no gradient for {name}"
        assert g.dtype == x.dtype, f"grad {name} has dtype {g.dtype}, input {x.dtype}"
        err = (g.double() - r).abs().max().item()
        scale = r.abs().max().item()
        assert err <= rtol * scale, f"grad {name}: max abs error {err:.3e} > {rtol} * {scale:.3e}"


def check_against_float64(hidden, weight, bias, targets, rtol=1e-5, grad_rtol=1e-5, **kwargs):
    """:func:`run_both`, then the values to ``rtol`` and the gradients to ``grad_rtol``; the kernel's gradients."""
    out, grads, ref, ref_grads = run_both(hidden, weight, bias, targets, **kwargs)
    assert_values(out, ref, rtol)
    assert_grads(grads, ref_grads, (hidden, weight, bias), grad_rtol)
    return grads


# ---------------------------------------------------------------------------------------------------------------------
# Values and gradients
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("clamp_fraction", [0.0, 0.3, 0.9])
@pytest.mark.parametrize("temperature", [0.7, 1.3])
@pytest.mark.parametrize("chunk_size", [1, 7, 64, None])
def test_matches_float64_fp32(clamp_fraction, temperature, chunk_size):
    check_against_float64(
        *make_inputs(), temperature=temperature, clamp_fraction=clamp_fraction, chunk_size=chunk_size, backend="torch"
    )


@pytest.mark.parametrize("clamp_fraction", [0.0, 0.3])
@pytest.mark.parametrize("logit_scale", [1.0, 0.25, 1 / 8])
@pytest.mark.parametrize("softcap", [None, 2.0])
def test_softcap_and_logit_scale_match_float64(softcap, logit_scale, clamp_fraction):
    """TRL's logit map: ``softcap * tanh(scale * logits / softcap) / T``. The logits here have a std of ~3, so a cap
    of 2 bends most of them (``1 - tanh^2`` spans ~0.01-1) and the scale changes every gradient: dropping either
    factor from the backward, or applying them in the wrong order, fails this test."""
    check_against_float64(
        *make_inputs(seed=13),
        temperature=0.7,
        clamp_fraction=clamp_fraction,
        chunk_size=7,
        backend="torch",
        logit_scale=logit_scale,
        final_logit_softcapping=softcap,
    )


def test_zero_logit_scale_gives_the_uniform_distribution():
    hidden, weight, bias, targets = make_inputs()
    leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    out = chunked_logprob_entropy(
        leaves[0], leaves[1], targets, bias=leaves[2], clamp_fraction=0.3, logit_scale=0.0, final_logit_softcapping=5.0
    )
    torch.testing.assert_close(out[0], torch.full((N,), -math.log(V)))
    torch.testing.assert_close(out[1], torch.full((N,), math.log(V)))
    sum(o.sum() for o in out).backward()
    assert all(torch.equal(t.grad, torch.zeros_like(t)) for t in leaves)


@pytest.mark.parametrize("clamp_fraction", [0.0, 0.3])
def test_without_bias(clamp_fraction):
    hidden, weight, _, targets = make_inputs(bias=False)
    check_against_float64(hidden, weight, None, targets, clamp_fraction=clamp_fraction, chunk_size=5)


@pytest.mark.parametrize("used", [s for r in (1, 2, 3) for s in itertools.combinations(OUTPUTS, r)])
@pytest.mark.parametrize("clamp_fraction", [0.0, 0.3])
def test_every_subset_of_outputs_in_the_loss(used, clamp_fraction):
    check_against_float64(
        *make_inputs(seed=3), used=used, seed=7, temperature=1.3, clamp_fraction=clamp_fraction, chunk_size=6
    )


@pytest.mark.parametrize("clamp_fraction", [0.0, 0.3, 0.9])
@pytest.mark.parametrize("logit_map", [{}, dict(logit_scale=0.25, final_logit_softcapping=2.0)])
def test_bf16_inputs_accumulate_in_fp32(clamp_fraction, logit_map, monkeypatch):
    # Small vocabulary tiles for the fp32 upcast of the weight: 301 columns in tiles of 64 (the last one partial).
    monkeypatch.setattr(lpe, "UPCAST_TILE_BYTES", 64 * 4 * D)
    # The bf16 values are exact in float64: fp32 accumulation gives fp32-accurate outputs (rounding the logits to bf16
    # anywhere would show up as ~1e-2 errors); the gradients come back in bf16 (one final rounding).
    check_against_float64(
        *make_inputs(dtype=torch.bfloat16, seed=5),
        grad_rtol=1e-2,
        temperature=0.7,
        clamp_fraction=clamp_fraction,
        chunk_size=8,
        **logit_map,
    )


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("logit_map", [{}, dict(logit_scale=0.25, final_logit_softcapping=2.0)])
def test_fp32_output_matmul_path_for_half_weights(logit_map, with_bias):
    """The CUDA bf16 path (GEMMs with bf16 operands and fp32 output), emulated exactly on the CPU. Without a bias the
    gradient step writes the GEMMs' bf16 operand itself; with one, the bias gradient sums the fp32 gradient first."""
    hidden, weight, bias, targets = make_inputs(dtype=torch.bfloat16, seed=12, bias=with_bias)
    with emulate_fp32_output_gemm() as calls:
        # the logits gradient is rounded to bf16 for the gradient GEMMs (fp32 accumulation), then bf16 outputs
        check_against_float64(
            hidden, weight, bias, targets, grad_rtol=2e-2, clamp_fraction=0.3, chunk_size=8, **logit_map
        )
    assert calls, "the fp32-output matmul path was not taken"


def test_fp32_output_matmul_path_allocates_no_temporary_per_chunk():
    """The fp32-output GEMMs write into the chunk buffer and accumulate into the gradients in place: whatever the
    number of chunks, the forward allocates one chunk of logits and the backward one ``V x d`` fp32 buffer (the
    weight-gradient accumulator), never a chunk-sized or ``V x d`` product per chunk."""
    n, chunk = 32, 4
    hidden, weight, bias, targets = make_inputs(dtype=torch.bfloat16, n=n, seed=12)
    leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    chunk_bytes, weight_grad_bytes = chunk * V * 4, V * D * 4
    assert 3 * chunk_bytes < weight_grad_bytes  # the torch path's largest work buffer is 3 chunks
    allocations = TensorAllocations()
    with emulate_fp32_output_gemm(allocations) as calls, allocations:
        out = chunked_logprob_entropy(*leaves[:2], targets, bias=leaves[2], clamp_fraction=0.3, chunk_size=chunk)
        n_forward = len(allocations.sizes)
        sum(o.sum() for o in out).backward()
    forward, backward = allocations.sizes[:n_forward], allocations.sizes[n_forward:]
    assert calls and all(call.endswith("(out=)") for call in calls), calls
    assert forward.count(chunk_bytes) == 1 and max(forward) < weight_grad_bytes, sorted(forward)
    assert backward.count(chunk_bytes) == 1, sorted(backward)
    assert [size for size in backward if size >= weight_grad_bytes] == [weight_grad_bytes], sorted(backward)


def test_mixed_dtypes_fp32_hidden_bf16_weight():
    hidden, weight, bias, targets = make_inputs(seed=6)
    weight = weight.bfloat16()
    grads = check_against_float64(hidden, weight, bias, targets, grad_rtol=1e-2, clamp_fraction=0.3, chunk_size=4)
    assert grads[0].dtype == torch.float32 and grads[1].dtype == torch.bfloat16


def test_only_some_inputs_require_grad():
    hidden, weight, bias, targets = make_inputs(seed=8)
    h = hidden.clone().requires_grad_()
    lp, ent, clamped = chunked_logprob_entropy(h, weight, targets, bias=bias, clamp_fraction=0.3, chunk_size=5)
    (lp.sum() + clamped.sum()).backward()
    h64 = hidden.double().requires_grad_()
    r = reference(h64, weight.double(), targets, bias.double(), clamp_fraction=0.3)
    (r[0].sum() + r[2].sum()).backward()
    assert (h.grad.double() - h64.grad).abs().max() <= 1e-5 * h64.grad.abs().max()


def test_outputs_without_grad_and_no_grad_mode():
    hidden, weight, bias, targets = make_inputs()
    with torch.no_grad():
        out = chunked_logprob_entropy(hidden, weight, targets, bias=bias, clamp_fraction=0.3)
    ref = reference(hidden.double(), weight.double(), targets, bias.double(), clamp_fraction=0.3)
    assert_values(out, ref)
    assert not any(o.requires_grad for o in out)


@pytest.mark.parametrize("logit_map", [{}, dict(logit_scale=0.25, final_logit_softcapping=2.0)])
def test_naive_reference_function_matches_float64(logit_map):
    hidden, weight, bias, targets = make_inputs(seed=4)
    kwargs = dict(temperature=0.7, clamp_fraction=0.3, **logit_map)
    out, grads, ref, ref_grads = run_both(hidden, weight, bias, targets, **kwargs)
    leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    naive = naive_logprob_entropy(leaves[0], leaves[1], targets, bias=leaves[2], **kwargs)
    assert_values(naive, ref)
    g = torch.Generator().manual_seed(1)
    w = [torch.randn(N, generator=g, dtype=torch.float64) for _ in OUTPUTS]
    sum((o.double() * wi).sum() for o, wi in zip(naive, w)).backward()
    assert_grads([t.grad for t in leaves], ref_grads, (hidden, weight, bias))


# ---------------------------------------------------------------------------------------------------------------------
# The clamp
# ---------------------------------------------------------------------------------------------------------------------
def test_clamp_fraction_zero_reuses_the_entropy():
    hidden, weight, bias, targets = make_inputs()
    for fraction in (0.0, 0.5 / V):  # floor(p * V) == 0 as well
        lp, ent, clamped = chunked_logprob_entropy(hidden, weight, targets, bias=bias, clamp_fraction=fraction)
        assert torch.equal(ent, clamped)


def test_clamped_set_is_exactly_the_largest_logits():
    """With weight = I the hidden states are the logits and d(loss)/d(hidden) is d(loss)/dz (times 1/T)."""
    vocab, n = 97, 12
    g = torch.Generator().manual_seed(11)
    z = torch.randn(n, vocab, generator=g, dtype=torch.float64)  # tie-free
    weight = torch.eye(vocab)
    for fraction in (0.3, 0.9, 0.01, 0.99):
        k = math.floor(fraction * vocab)
        h = z.float().clone().requires_grad_()
        _, _, clamped = chunked_logprob_entropy(h, weight, torch.zeros(n, dtype=torch.long), clamp_fraction=fraction)
        clamped.sum().backward()
        dropped = z.argsort(-1)[:, :k]
        kept_mask = torch.ones(n, vocab, dtype=torch.bool).scatter_(1, dropped, False)
        assert (h.grad[~kept_mask] == 0).all(), "dropped entries must get exactly zero gradient"
        if vocab - k > 1:  # a single kept entry has zero entropy and zero gradient
            assert (h.grad[kept_mask] != 0).all(), "every kept entry gets a gradient"
        # and the value is the entropy of the softmax over exactly those entries
        zk = z.masked_fill(~kept_mask, -math.inf)
        pk = torch.softmax(zk, -1)
        expected = -(pk * torch.log_softmax(zk, -1).masked_fill(~kept_mask, 0)).sum(-1)
        torch.testing.assert_close(clamped.double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fraction", [0.01, 0.3, 0.5, 0.9, 0.999])
@pytest.mark.parametrize("vocab", [7, 300, 5000])
def test_threshold_selection_counts_exactly_k(fraction, vocab):
    g = torch.Generator().manual_seed(vocab)
    k = max(1, math.floor(fraction * vocab))
    for z in (
        torch.randn(9, vocab, generator=g),
        torch.randn(9, vocab, generator=g).exp() * 10,  # skewed
        torch.linspace(-3, 3, vocab)[torch.randperm(vocab, generator=g)].repeat(9, 1),  # evenly spread
    ):
        thr = kth_smallest_threshold(z, k)
        assert torch.equal((z <= thr[:, None]).sum(1), torch.full((9,), k))


def test_threshold_selection_with_ties_falls_back_to_the_kth_value():
    g = torch.Generator().manual_seed(0)
    z = torch.randint(0, 4, (6, 200), generator=g).float()
    thr = kth_smallest_threshold(z, 77)
    assert torch.equal(thr, torch.kthvalue(z, 77, dim=1).values)


def test_fully_tied_rows_keep_the_maximum():
    weight = torch.eye(5)
    h = torch.zeros(3, 5)  # every logit equal
    lp, ent, clamped = chunked_logprob_entropy(h, weight, torch.tensor([0, 1, 2]), clamp_fraction=0.6)
    assert torch.isfinite(clamped).all()
    torch.testing.assert_close(ent, torch.full((3,), math.log(5)))


# ---------------------------------------------------------------------------------------------------------------------
# Numerics
# ---------------------------------------------------------------------------------------------------------------------
def test_high_confidence_token_gradient_is_exact():
    """p_target ~ 1 - 1e-7: 1 - p must come from -expm1(log p), not from a subtraction in fp32."""
    vocab, n = 64, 4
    g = torch.Generator().manual_seed(2)
    gap = math.log((vocab - 1) / 1e-7)  # every other entry has p ~ 1e-7 / (V - 1)
    z = -gap + 0.1 * torch.randn(n, vocab, generator=g, dtype=torch.float64)
    targets = torch.tensor([3, 10, 0, 63])
    z[torch.arange(n), targets] = 0.0
    z = z.float().double()  # exactly representable in fp32
    weight = torch.eye(vocab)
    for used in (("log_probs",), ("entropy",), ("clamped_entropy",), OUTPUTS):
        h = z.float().clone().requires_grad_()
        out = chunked_logprob_entropy(h, weight, targets, clamp_fraction=0.3)
        g_w = [torch.ones(n) * (i + 1) for i in range(3)]
        sum((out[OUTPUTS.index(name)] * g_w[OUTPUTS.index(name)]).sum() for name in used).backward()
        z64 = z.clone().requires_grad_()
        ref = reference(z64, weight.double(), targets, clamp_fraction=0.3)
        sum((ref[OUTPUTS.index(name)] * g_w[OUTPUTS.index(name)].double()).sum() for name in used).backward()
        p_t = ref[0].exp()
        assert (1 - p_t).max() < 2e-7 and (1 - p_t).min() > 5e-8
        # every value and every gradient entry to fp32 relative accuracy, the target's 1 - p included
        for a, b in zip(out, ref):
            torch.testing.assert_close(a.double(), b.detach(), rtol=1e-5, atol=0.0)
        torch.testing.assert_close(h.grad.double(), z64.grad, rtol=1e-5, atol=0.0)
        if "log_probs" in used and len(used) == 1:
            target_grad = h.grad[torch.arange(n), targets].double()
            torch.testing.assert_close(target_grad, 1 - p_t.detach(), rtol=1e-5, atol=0.0)


# ---------------------------------------------------------------------------------------------------------------------
# TRL's fused head
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_equals_trl_fused_head_without_clamp(temperature):
    from trl.kernels import ChunkedLogProbFunction

    hidden, weight, bias, targets = make_inputs(seed=9)
    g = torch.Generator().manual_seed(0)
    w_lp, w_ent = torch.randn(N, generator=g), torch.randn(N, generator=g)

    leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    lp, ent, _ = chunked_logprob_entropy(leaves[0], leaves[1], targets, bias=leaves[2], temperature=temperature)
    ((lp * w_lp).sum() + (ent * w_ent).sum()).backward()

    trl_leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    trl_out = ChunkedLogProbFunction.apply(
        trl_leaves[0], trl_leaves[1], trl_leaves[2], targets, temperature, 128, None, 1.0, ("log_probs", "entropy")
    )
    ((trl_out[0] * w_lp).sum() + (trl_out[1] * w_ent).sum()).backward()

    torch.testing.assert_close(lp, trl_out[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, trl_out[1], rtol=1e-5, atol=1e-5)
    for ours, theirs in zip(leaves, trl_leaves):
        assert (ours.grad - theirs.grad).abs().max() <= 1e-5 * theirs.grad.abs().max()


# ---------------------------------------------------------------------------------------------------------------------
# Memory: O(N) floats and the kept set's bits are saved, one chunk of logits at a time
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "bits_saved"),
    [(dict(clamp_fraction=0.3), True), (dict(top_p=0.5), True), (dict(clamp_fraction=0.0), False)],
)
def test_forward_saves_only_inputs_per_token_floats_and_the_kept_bits(kwargs, bits_saved):
    """Besides the inputs, a few floats per token; with a kept set, one bit per logit too (ceil(V / 8) bytes a row)."""
    n, d, vocab = 40, 8, 501  # weight (V x d) is smaller than N x V
    hidden, weight, bias, targets = make_inputs(n=n, d=d, vocab=vocab)
    leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = chunked_logprob_entropy(leaves[0], leaves[1], targets, bias=leaves[2], chunk_size=8, **kwargs)
    inputs = {t.data_ptr() for t in leaves} | {targets.data_ptr()}
    assert saved, "the hook saw nothing"
    bits = [t for t in saved if t.dtype == torch.uint8]
    assert [tuple(t.shape) for t in bits] == ([(n, 63)] if bits_saved else [])
    for t in saved:
        if t.data_ptr() in inputs or t.dtype == torch.uint8:
            continue
        assert t.numel() <= n, f"a saved tensor of shape {tuple(t.shape)} is larger than one float per token"
    per_token = [t for t in saved if t.data_ptr() not in inputs and t.dtype != torch.uint8]
    assert len(per_token) <= 8
    sum(o.sum() for o in out).backward()


def test_grad_tile_rounds_its_half_output_like_a_separate_product():
    """The torch path's ``grad_tile`` with ``out``: the same bits as its fp32 gradient times ``scale`` rounded by a
    separate ``torch.mul`` (the Triton kernel's own check, under the interpreter, is the same function)."""
    check_grad_tile_rounds_like_torch(_torch_ops)


@pytest.mark.parametrize("vocab", [1, 8, 13, 301])
def test_kept_bits_round_trip_in_the_documented_layout(vocab):
    """``pack_kept``: bit j of byte b of a row is column 8 b + j (the last byte's high bits 0), checked against that
    formula in integers; ``unpack_kept`` gives back any run of columns, wherever it starts in a byte."""
    n = 5
    g = torch.Generator().manual_seed(vocab)
    kept = torch.rand(n, vocab, generator=g) < 0.4
    kept[0], kept[1] = True, False  # all bits set, none set
    bits = _torch_ops.pack_kept(kept.float(), torch.empty(n, _torch_ops.kept_bytes(vocab), dtype=torch.uint8))
    assert bits.shape == (n, (vocab + 7) // 8)
    for row in range(n):
        for byte in range(bits.shape[1]):
            want = sum(1 << j for j in range(8) if 8 * byte + j < vocab and kept[row, 8 * byte + j])
            assert bits[row, byte].item() == want, (row, byte)
    assert torch.equal(_torch_ops.pack_kept(kept, torch.empty_like(bits)), bits)  # bool in, the same bits
    for start in sorted({0, 1, 7, vocab // 2, vocab - 1}):
        for width in sorted({1, vocab - start, (vocab - start) // 2}):
            if width < 1 or start + width > vocab:
                continue
            out = torch.full((n, width), 7.0)
            got = _torch_ops.unpack_kept(bits, start, width, out)
            assert got is out and torch.equal(out, kept[:, start : start + width].float()), (start, width)


def test_at_most_one_chunk_of_logits_at_a_time(logit_shapes):
    shapes = logit_shapes
    hidden, weight, bias, targets = make_inputs()
    h = hidden.clone().requires_grad_()
    out = chunked_logprob_entropy(h, weight, targets, bias=bias, clamp_fraction=0.3, chunk_size=5)
    sum(o.sum() for o in out).backward()
    assert shapes and max(rows for rows, _ in shapes) <= 5
    assert len(shapes) == 2 * math.ceil(N / 5)  # every chunk once in the forward, once recomputed in the backward


@pytest.mark.parametrize("as_parameters", [True, False], ids=["parameters", "converted copies"])
def test_lm_head_is_gathered_in_forward_and_in_the_recomputing_backward(as_parameters, monkeypatch):
    """ZeRO-3 re-partitions the head after the forward, so the backward's recompute must gather it again: the
    caller's ``gather_parameters`` (recorded here) is entered with the objects the caller passed (what the Function
    saved, not copies), and every recompute runs inside it. Copies the caller converted (as with
    ``cast_lm_head_to_fp32``) are handed over the same way, and the gradients still reach the parameters behind
    them."""
    entered, active = [], []

    @contextlib.contextmanager
    def recording_gather(weight, bias):
        entered.append((weight, bias))
        active.append(True)
        try:
            yield
        finally:
            active.pop()

    recomputed_inside = []
    original = lpe._chunk_logits

    def spy(*args):
        recomputed_inside.append(bool(active))
        return original(*args)

    monkeypatch.setattr(lpe, "_chunk_logits", spy)
    hidden, weight, bias, targets = make_inputs(seed=14)
    if as_parameters:
        w_param, b_param = torch.nn.Parameter(weight), torch.nn.Parameter(bias)
        w_in, b_in, rtol = w_param, b_param, 1e-5
    else:  # bf16 parameters, handed to the kernel as fp32 copies
        w_param, b_param = torch.nn.Parameter(weight.bfloat16()), torch.nn.Parameter(bias.bfloat16())
        w_in, b_in, rtol = w_param.float(), b_param.float(), 1e-2
    h = hidden.clone().requires_grad_()
    out = chunked_logprob_entropy(
        h,
        w_in,
        targets,
        bias=b_in,
        clamp_fraction=0.3,
        chunk_size=5,
        logit_scale=0.5,
        gather_parameters=recording_gather,
    )
    n_forward_calls = len(recomputed_inside)
    assert len(entered) == 1 and entered[0][0] is w_in and entered[0][1] is b_in
    sum(o.sum() for o in out).backward()
    assert len(entered) == 2 and entered[1][0] is w_in and entered[1][1] is b_in, "backward"
    assert len(recomputed_inside) == 2 * n_forward_calls == 2 * math.ceil(N / 5) and all(recomputed_inside)

    leaves64 = [t.detach().double().requires_grad_() for t in (h, w_param, b_param)]
    ref = reference(*leaves64[:2], targets, leaves64[2], clamp_fraction=0.3, logit_scale=0.5)
    sum(r.sum() for r in ref).backward()
    assert_values(out, ref)
    assert_grads([h.grad, w_param.grad, b_param.grad], [t.grad for t in leaves64], (h, w_param, b_param), rtol=rtol)


KERNELS_DIR = Path(__file__).resolve().parents[2] / "trl_entropy" / "kernels"


def test_kernels_import_neither_trl_nor_transformers():
    """``trl_entropy/kernels/`` stands alone: the sharded-parameter gather is the caller's (``gather_parameters``)."""
    sources = sorted(KERNELS_DIR.rglob("*.py"))
    assert len(sources) >= 4, sources
    found = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module",
                "__import__",
            ):
                names = [arg.value for arg in node.args[:1] if isinstance(arg, ast.Constant)]
            else:
                continue
            found += [f"{path.name}: {name}" for name in names if name.split(".")[0] in ("trl", "transformers")]
    assert not found, found


def test_default_chunk_size_follows_the_memory_budget():
    assert lpe.default_chunk_size(10, 100) == 10
    rows = lpe.default_chunk_size(100_000, 151_936)
    assert rows * 151_936 * 4 <= lpe.CHUNK_BYTES_CPU and rows >= 1
    assert lpe.default_chunk_size(100_000, 10**9) == 1


# ---------------------------------------------------------------------------------------------------------------------
# Edge cases and validation
# ---------------------------------------------------------------------------------------------------------------------
def test_empty_batch_is_differentiable():
    _, weight, bias, _ = make_inputs()
    h = torch.zeros(0, D, requires_grad=True)
    out = chunked_logprob_entropy(h, weight, torch.zeros(0, dtype=torch.long), bias=bias, clamp_fraction=0.3)
    assert all(o.shape == (0,) for o in out)
    sum(o.sum() for o in out).backward()
    assert h.grad.shape == (0, D)


def test_auto_backend_on_cpu_is_torch(monkeypatch):
    calls = []
    monkeypatch.setattr(lpe, "_triton_ops", lambda: calls.append(1))
    hidden, weight, bias, targets = make_inputs()
    chunked_logprob_entropy(hidden, weight, targets, bias=bias, backend="auto")
    assert not calls


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(hidden=torch.zeros(N)), "hidden must be a 2-D"),
        (dict(hidden=torch.zeros(2, N, D)), "hidden must be a 2-D"),
        (dict(weight=torch.zeros(V, D + 1)), "hidden size"),
        (dict(weight=torch.zeros(V)), "weight must be a 2-D"),
        (dict(targets=torch.zeros(N + 1, dtype=torch.long)), "targets must have shape"),
        (dict(targets=torch.zeros(N, 1, dtype=torch.long)), "targets must have shape"),
        (dict(targets=torch.zeros(N)), "integer"),
        (dict(targets=torch.full((N,), V, dtype=torch.long)), r"target ids must be in \[0, V\)"),
        (dict(targets=torch.full((N,), -1, dtype=torch.long)), r"target ids must be in \[0, V\)"),
        (dict(bias=torch.zeros(V + 1)), "bias must have shape"),
        (dict(clamp_fraction=1.0), "clamp_fraction"),
        (dict(clamp_fraction=-0.1), "clamp_fraction"),
        (dict(clamp_fraction=float("nan")), "clamp_fraction"),
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(backend="cuda"), "unknown backend"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(logit_scale=float("nan")), "logit_scale"),
        (dict(logit_scale=float("inf")), "logit_scale"),
        (dict(logit_scale="0.5x"), "logit_scale"),
        (dict(final_logit_softcapping=0.0), "final_logit_softcapping"),
        (dict(final_logit_softcapping=-30.0), "final_logit_softcapping"),
        (dict(final_logit_softcapping=float("inf")), "final_logit_softcapping"),
        (dict(final_logit_softcapping=float("nan")), "final_logit_softcapping"),
        (dict(gather_parameters=object()), "gather_parameters"),
    ],
)
def test_bad_inputs_raise_value_error(change, message):
    hidden, weight, bias, targets = make_inputs()
    kwargs = dict(hidden=hidden, weight=weight, targets=targets, bias=bias)
    kwargs.update(change)
    with pytest.raises(ValueError, match=message):
        chunked_logprob_entropy(kwargs.pop("hidden"), kwargs.pop("weight"), kwargs.pop("targets"), **kwargs)


def test_triton_backend_unavailable_raises(monkeypatch):
    monkeypatch.setattr(lpe, "triton_available", lambda: False)
    hidden, weight, bias, targets = make_inputs()
    with pytest.raises(ValueError, match="triton"):
        chunked_logprob_entropy(hidden, weight, targets, backend="triton")


def test_triton_backend_on_cpu_without_interpreter_raises():
    if not lpe.triton_available():
        pytest.skip("triton not installed")
    if lpe._triton_ops().INTERPRET:
        pytest.skip("this process runs Triton in interpreter mode")
    hidden, weight, bias, targets = make_inputs()
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        chunked_logprob_entropy(hidden, weight, targets, backend="triton")


# ---------------------------------------------------------------------------------------------------------------------
# The backward's blocks
# ---------------------------------------------------------------------------------------------------------------------
def test_backward_blocks_read_the_weight_gradient_once_per_token_block():
    """The backward recomputes in blocks of BACKWARD_TOKEN_BLOCK tokens, within the forward's buffer, with a kept set
    or without (a kept set comes from the forward's bits)."""
    vocab = 151936
    chunk = lpe.default_chunk_size(16384, vocab, "cuda")
    assert chunk == 441
    rows, width = lpe._backward_blocks(16384, vocab, chunk, vocab)
    assert (rows, width) == (4096, 16128)  # 441 * 151936 // 4096 = 16358 entries, down to a multiple of 256
    assert rows * width <= chunk * vocab
    assert math.ceil(16384 / rows) == 4 and math.ceil(16384 / chunk) == 38  # accumulations of each weight slice
    assert lpe._backward_blocks(300, vocab, 441, vocab) == (441, vocab)  # one chunk: as the forward
    # the CPU's bf16 path upcasts the weight in tiles of 2048 rows at d = 4096: the tile bounds the width
    assert lpe._backward_blocks(16384, vocab, 110, 2048) == (4080, 2048)
    # a small chunk: blocks as tall as keep them 4096 entries wide
    assert lpe._backward_blocks(16384, vocab, 8, vocab) == (296, 4096)
    # a chunk of a small vocabulary holds no taller block of 301 entries: the forward's
    assert lpe._backward_blocks(5000, 301, 7, 64) == (7, 64)


@pytest.mark.parametrize(
    ("used", "kwargs"),
    [
        (("log_probs", "entropy"), dict(clamp_fraction=0.3)),  # the clamped entropy not in the loss: no kept set
        (OUTPUTS, dict(clamp_fraction=0.0)),
        (OUTPUTS, dict(clamp_fraction=0.0, logit_scale=0.25, final_logit_softcapping=2.0)),
    ],
)
def test_backward_in_token_blocks_matches_float64(used, kwargs, logit_shapes, monkeypatch):
    """50 tokens in backward blocks of 16 (16 + 16 + 16 + 2) by vocabulary tiles of 256 (256 + 256 + 188), against
    float64; the recomputed shapes are the backward's blocks, not the forward's chunks of 7."""
    monkeypatch.setattr(lpe, "BACKWARD_TOKEN_BLOCK", 16)
    monkeypatch.setattr(lpe, "BACKWARD_MIN_WIDTH", 256)
    shapes = logit_shapes
    check_against_float64(*make_inputs(n=50, vocab=700, seed=21), used=used, chunk_size=7, backend="torch", **kwargs)
    backward = shapes[math.ceil(50 / 7) :]
    assert backward == [(rows, width) for rows in (16, 16, 16, 2) for width in (256, 256, 188)], backward


@pytest.mark.parametrize("clamp_fraction", [0.3, 0.9])
def test_backward_with_a_kept_set_reads_the_forward_bits_in_token_blocks(clamp_fraction, logit_shapes, monkeypatch):
    """With the clamped entropy in the loss the backward recomputes in blocks of 16 x 131, not the forward's chunks of
    7, and matches float64: each row's k-th logit is the threshold itself, and a kept set taken from logits recomputed
    in another shape (``z > thr``) puts the entries a recompute rounds up in the set (the gradients then miss float64
    by far). The set comes from the forward's bits instead."""
    monkeypatch.setattr(lpe, "BACKWARD_TOKEN_BLOCK", 16)
    monkeypatch.setattr(lpe, "BACKWARD_MIN_WIDTH", 32)
    hidden, weight, bias, targets = make_inputs()
    _, grads, _, ref_grads = run_both(hidden, weight, bias, targets, chunk_size=7, clamp_fraction=clamp_fraction)
    assert_grads(grads, ref_grads, (hidden, weight, bias))
    forward = logit_shapes[: math.ceil(N / 7)]
    assert forward == [(7, V)] * 3 + [(2, V)]
    assert logit_shapes[len(forward) :] == [(rows, width) for rows in (16, 7) for width in (131, 131, 39)]


def test_fp32_output_matmul_path_in_token_blocks(logit_shapes, monkeypatch):
    """The CUDA bf16 path (emulated) with the backward in token blocks: bf16 gradients within their rounding."""
    monkeypatch.setattr(lpe, "BACKWARD_TOKEN_BLOCK", 16)
    monkeypatch.setattr(lpe, "BACKWARD_MIN_WIDTH", 256)
    hidden, weight, bias, targets = make_inputs(dtype=torch.bfloat16, n=50, vocab=700, seed=22)
    with emulate_fp32_output_gemm() as calls:
        out, grads, ref, ref_grads = run_both(hidden, weight, bias, targets, clamp_fraction=0.0, chunk_size=7)
    assert calls
    assert_values(out, ref, rtol=1e-5)
    assert_grads(grads, ref_grads, (hidden, weight, bias), rtol=2e-2)
    backward = logit_shapes[math.ceil(50 / 7) :]
    assert backward == [(rows, width) for rows in (16, 16, 16, 2) for width in (256, 256, 188)], backward
