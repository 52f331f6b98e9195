"""The Triton path of the fused kernel.

* ``test_triton_interpreter_matches_float64`` runs this file as a script in a subprocess with ``TRITON_INTERPRET=1``
  (Triton reads it when the kernels are decorated, so it cannot be switched on inside this pytest process without
  affecting everything else). The script loads ``trl_entropy/kernels/`` standalone, without importing
  ``trl_entropy``/TRL, and
  checks values and gradients of ``backend="triton"`` against float64 at small sizes (N=8, d=32, V=300), with
  and without TRL's logit map (soft-cap and logit scale), and the clamp's boundary on tied logits (``clamp_boundary``),
  which a copy of the kernels with ``>=`` planted in their kept tests must fail.
* ``test_triton_kernels_compile_for_cuda`` compiles both kernels ahead of time for sm_80 and sm_90 (no GPU needed), so
  a kernel that only the interpreter accepts fails here.

The clamp's threshold (the sampled-window selection) has its own interpreter tests: ``test_kernel_triton_select.py``.
"""

import dataclasses
import functools
import importlib.util
import itertools
import math
import os
import sys
import time
from pathlib import Path

import pytest
import torch
from _reference.clamp_boundary import TIE_CASES, check_clamp_on_ties
from _reference.float64_reference import kernel_inputs, reference
from _reference.grad_tile_rounding import check_grad_tile_rounds_like_torch
from _support.interpreter import reduce_xor_sums_with_numpy, use_interpreter_tiles
from _support.watchdog import run_watched


KERNELS_DIR = Path(__file__).resolve().parents[2] / "trl_entropy" / "kernels"
OUTPUTS = ("log_probs", "entropy", "clamped_entropy")
REFERENCE_KWARGS = ("temperature", "clamp_fraction", "logit_scale", "final_logit_softcapping")


def _triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


# ---------------------------------------------------------------------------------------------------------------------
# Interpreter checks (run as a script, in a subprocess)
# ---------------------------------------------------------------------------------------------------------------------
def _load_kernels_standalone():
    spec = importlib.util.spec_from_file_location(
        "trl_entropy_kernels_standalone", KERNELS_DIR / "__init__.py", submodule_search_locations=[str(KERNELS_DIR)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


_inputs = functools.partial(kernel_inputs, n=8, d=32, vocab=300, weight_scale=0.5)


def _close(actual, expected, rtol, what):
    err = (actual.double() - expected.double()).abs().max().item()
    scale = expected.abs().max().item()
    assert err <= rtol * scale, f"{what}: max abs error {err:.3e} > {rtol} * {scale:.3e}"


def _check(kernels, hidden, weight, bias, targets, *, used_sets=(OUTPUTS,), rtol_grad=1e-5, **kwargs):
    """One forward; for each set of outputs in the loss, gradients vs float64 (autograd.grad with retain_graph)."""
    leaves = [t.clone().requires_grad_() if t is not None else None for t in (hidden, weight, bias)]
    out = kernels.chunked_logprob_entropy(leaves[0], leaves[1], targets, bias=leaves[2], backend="triton", **kwargs)
    ref_leaves = [t.double().requires_grad_() if t is not None else None for t in (hidden, weight, bias)]
    ref_kwargs = {k: v for k, v in kwargs.items() if k in REFERENCE_KWARGS}
    ref = reference(ref_leaves[0], ref_leaves[1], targets, bias=ref_leaves[2], **ref_kwargs)
    for name, a, b in zip(OUTPUTS, out, ref):
        assert a.dtype == torch.float32
        _close(a, b, 1e-5, name)
    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(hidden.shape[0], generator=g, dtype=torch.float64) for _ in OUTPUTS]
    inputs = [x for x in leaves if x is not None]
    ref_inputs = [x for x in ref_leaves if x is not None]
    for used in used_sets:
        idx = [OUTPUTS.index(name) for name in used]
        grads = torch.autograd.grad(
            [out[i] for i in idx], inputs, [weights[i].float() for i in idx], retain_graph=True
        )
        ref_grads = torch.autograd.grad(
            [ref[i] for i in idx], ref_inputs, [weights[i] for i in idx], retain_graph=True
        )
        for name, x, gr, rg in zip(("hidden", "weight", "bias"), inputs, grads, ref_grads):
            assert gr.dtype == x.dtype, f"{name} grad dtype {gr.dtype}"
            _close(gr, rg, rtol_grad, f"grad {name} with {used} in the loss ({kwargs})")
    return out


def interpreter_checks() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    reduce_xor_sums_with_numpy()
    kernels = _load_kernels_standalone()
    ops = kernels.logprob_entropy._triton_ops()
    assert ops.INTERPRET, "the kernels were not decorated in interpreter mode"
    use_interpreter_tiles(ops)
    start = time.time()

    def done(what):
        print(f"ok {time.time() - start:6.1f}s  {what}", flush=True)

    hidden, weight, bias, targets = _inputs()
    all_subsets = [s for r in (1, 2, 3) for s in itertools.combinations(OUTPUTS, r)]
    soft = dict(final_logit_softcapping=2.0, logit_scale=0.25, temperature=0.7)

    # values and gradients: clamp 0 / 0.3 / 0.9, temperatures, chunk sizes (8 rows: 5 and 7 leave a partial chunk)
    _check(kernels, hidden, weight, bias, targets, clamp_fraction=0.0, temperature=1.0, chunk_size=5)
    done("clamp 0, T=1, chunk 5")
    _check(
        kernels,
        hidden,
        weight,
        bias,
        targets,
        used_sets=all_subsets,
        clamp_fraction=0.3,
        temperature=0.7,
        chunk_size=5,
    )
    done("clamp 0.3, T=0.7, chunk 5, every subset of outputs in the loss")
    _check(kernels, hidden, weight, None, targets, clamp_fraction=0.9, temperature=1.3, chunk_size=None)
    done("clamp 0.9, T=1.3, no bias, default chunk")
    _check(kernels, hidden, weight, bias, targets, used_sets=all_subsets, clamp_fraction=0.0, chunk_size=16)
    done("clamp 0, every subset of outputs in the loss")

    # the backward's own blocks, 3 tokens by 200 vocabulary entries (rows 3 + 3 + 2, tiles 200 + 100)
    blocks = kernels.logprob_entropy
    defaults = blocks.BACKWARD_TOKEN_BLOCK, blocks.BACKWARD_MIN_WIDTH, blocks._chunk_logits
    blocks.BACKWARD_TOKEN_BLOCK, blocks.BACKWARD_MIN_WIDTH = 3, 128
    shapes = []

    def recorded(h, w, *args):
        shapes.append((h.shape[0], w.shape[0]))
        return defaults[2](h, w, *args)

    blocks._chunk_logits = recorded
    try:
        _check(kernels, hidden, weight, None, targets, clamp_fraction=0.0, chunk_size=2)
        # the forward's 4 chunks of 2, then the backward's blocks
        assert shapes[4:] == [(3, 200), (3, 100), (3, 200), (3, 100), (2, 200), (2, 100)], shapes
        _check(kernels, hidden, weight, bias, targets, used_sets=all_subsets, clamp_fraction=0.0, chunk_size=2)
        # with the clamp the same blocks: the kept set comes from the forward's bits
        shapes.clear()
        _check(kernels, hidden, weight, bias, targets, clamp_fraction=0.3, chunk_size=2)
        assert shapes[4:] == [(3, 200), (3, 100), (3, 200), (3, 100), (2, 200), (2, 100)], shapes
    finally:
        blocks.BACKWARD_TOKEN_BLOCK, blocks.BACKWARD_MIN_WIDTH, blocks._chunk_logits = defaults
    done("clamp 0 and 0.3, the backward in token blocks and vocabulary tiles of its own")

    # TRL's logit map (soft-cap 2 bends these logits, std ~2.8; both factors enter every gradient), clamp on and off
    for softcap, scale in itertools.product((None, 2.0), (1.0, 0.25, 1 / 8)):
        for clamp_fraction in (0.0, 0.3):
            _check(
                kernels,
                hidden,
                weight,
                bias,
                targets,
                clamp_fraction=clamp_fraction,
                temperature=0.7,
                chunk_size=7,
                logit_scale=scale,
                final_logit_softcapping=softcap,
            )
        done(f"soft-cap {softcap}, logit scale {scale}, clamp 0 and 0.3")

    # selection blocks of 64 columns, and windows of 16 entries (a row with a larger window selects over its whole row)
    default_sizes = ops.SELECTION
    ops.SELECTION = dataclasses.replace(default_sizes, sel_block=64, window_cap=16)
    try:
        _check(kernels, hidden, weight, bias, targets, clamp_fraction=0.3, temperature=1.3, chunk_size=8)
    finally:
        ops.SELECTION = default_sizes
    done("clamp 0.3 with small selection blocks and scratch rows")

    # agrees with the torch path
    a = kernels.chunked_logprob_entropy(hidden, weight, targets, bias=bias, clamp_fraction=0.3, backend="triton")
    b = kernels.chunked_logprob_entropy(hidden, weight, targets, bias=bias, clamp_fraction=0.3, backend="torch")
    for x, y, name in zip(a, b, OUTPUTS):
        _close(x, y, 1e-5, f"triton vs torch {name}")
    done("triton == torch")

    # bf16 inputs: fp32 accumulation (values to fp32 accuracy), bf16 gradients
    hb, wb, bb, tb = _inputs(dtype=torch.bfloat16, seed=3)
    _check(kernels, hb, wb, bb, tb, rtol_grad=1e-2, clamp_fraction=0.3, chunk_size=7)
    done("bf16 inputs")

    # the CUDA bf16 path (fp32-output GEMMs, emulated): without a bias the gradient kernel writes the GEMMs' bf16
    # operand itself; with one, a separate product rounds the fp32 gradient the bias gradient sums
    from _reference.cpu_emulation import emulate_fp32_output_gemm

    for b in (None, bb):
        with emulate_fp32_output_gemm(logprob_entropy=kernels.logprob_entropy) as calls:
            _check(kernels, hb, wb, b, tb, rtol_grad=2e-2, clamp_fraction=0.3, chunk_size=7, **soft)
        assert calls, "the fp32-output GEMM path was not taken"
    done("bf16 CUDA path (emulated), with and without a bias")
    check_grad_tile_rounds_like_torch(ops)
    done("the gradient kernel's bf16 operand = torch's product and rounding, bit for bit")

    # the clamped set: weight = I, so d(loss)/d(hidden) = d(loss)/dz; dropped entries get exactly 0
    vocab, n = 97, 6
    z = torch.randn(n, vocab, generator=torch.Generator().manual_seed(5))
    h = z.clone().requires_grad_()
    _, _, clamped = kernels.chunked_logprob_entropy(
        h, torch.eye(vocab), torch.zeros(n, dtype=torch.long), clamp_fraction=0.3, backend="triton"
    )
    clamped.sum().backward()
    k = math.floor(0.3 * vocab)
    kept = torch.ones(n, vocab, dtype=torch.bool).scatter_(1, z.argsort(-1)[:, :k], False)
    assert (h.grad[~kept] == 0).all() and (h.grad[kept] != 0).all(), "clamped set"
    done("clamped set")

    # high confidence: p_target ~ 1 - 1e-7
    vocab, n = 64, 4
    gap = math.log((vocab - 1) / 1e-7)
    z = -gap + 0.1 * torch.randn(n, vocab, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    targets_hc = torch.tensor([3, 10, 0, 63])
    z[torch.arange(n), targets_hc] = 0.0
    z = z.float()
    h = z.clone().requires_grad_()
    out = kernels.chunked_logprob_entropy(h, torch.eye(vocab), targets_hc, clamp_fraction=0.3, backend="triton")
    sum((o * (i + 1)).sum() for i, o in enumerate(out)).backward()
    z64 = z.double().requires_grad_()
    ref = reference(z64, torch.eye(vocab, dtype=torch.float64), targets_hc, clamp_fraction=0.3)
    sum((o * (i + 1)).sum() for i, o in enumerate(ref)).backward()
    assert (1 - ref[0].exp()).max() < 2e-7
    for x, y, name in zip(out, ref, OUTPUTS):
        torch.testing.assert_close(x.double(), y.detach(), rtol=1e-5, atol=0.0, msg=f"high-confidence {name}")
    torch.testing.assert_close(h.grad.double(), z64.grad, rtol=1e-5, atol=0.0, msg="high-confidence gradient")
    done("high-confidence token")

    # the clamp's boundary on tied logits; then with ">=" planted in the kernels' kept test, which must fail there
    triton_kernel = functools.partial(kernels.chunked_logprob_entropy, backend="triton")
    for case in TIE_CASES:
        check_clamp_on_ties(triton_kernel, case, 64)
    done("clamp boundary on tied logits")
    planted = _planted_ge_ops(ops)
    kernels.logprob_entropy._triton_ops = lambda: planted
    try:
        for case in TIE_CASES:  # the Triton threshold is always the k-th value itself: every tie case catches it
            try:
                check_clamp_on_ties(triton_kernel, case, 64)
            except AssertionError:
                continue
            raise AssertionError(f"the planted '>=' passed the tie check {case!r}")
    finally:
        kernels.logprob_entropy._triton_ops = lambda: ops
    done("a planted '>=' fails every tie case")
    print("ALL OK")


# The kept tests of ``_triton_ops.py`` (the forward's sums and bits, the target's flag), each written ``key > key``;
# the gradient reads the forward's bits.
_KEPT_TESTS = (
    ("kept = msk & (kz > thr_key)", "kept = msk & (kz >= thr_key)"),
    (".to(tl.int64) > thr_key).to(tl.float32)", ".to(tl.int64) >= thr_key).to(tl.float32)"),
)


def _planted_ge_ops(ops):
    """A copy of the Triton module whose kept tests keep entries equal to the threshold (the bug the tie checks are
    for), loaded from a temporary file (Triton reads a kernel's source)."""
    import tempfile

    source = Path(ops.__file__).read_text()
    for old, new in _KEPT_TESTS:
        assert source.count(old) == 1, f"kept test not found in _triton_ops.py: {old}"
        source = source.replace(old, new)
    path = Path(tempfile.mkdtemp()) / "_triton_ops_planted_ge.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("_triton_ops_planted_ge", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass's annotations resolve through it
    spec.loader.exec_module(module)
    return module


def test_triton_interpreter_matches_float64():
    if not _triton_importable():
        pytest.skip("triton is not installed")
    # Run as a script, this file finds the references through tests/ on its path, as pytest's rootdir conftest gives.
    tests = str(Path(__file__).resolve().parents[1])
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        PYTHONPATH=os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])),
    )
    proc = run_watched([sys.executable, __file__], "the interpreter checks of test_kernel_triton.py", env=env)
    report = f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr[-6000:]}"
    assert proc.returncode == 0 and "ALL OK" in proc.stdout, report


# ---------------------------------------------------------------------------------------------------------------------
# CUDA compilation (no GPU needed)
# ---------------------------------------------------------------------------------------------------------------------
_INT_ARGS = {
    "stride_z": "i64",
    "n_cols": "i32",
    "k": "i32",
    "span": "i32",
    "vocab_start": "i32",
    "scratch_per_row": "i32",
    "window_cap": "i32",
    "stride_bits": "i64",
    "stride_dtanh": "i64",
    "stride_out": "i64",
    "scale": "fp32",
}


def _signature(kernel, constexprs):
    sig = {}
    for name in kernel.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name == "tgt_ptr":
            sig[name] = "*i64"
        elif name == "bits_ptr":
            sig[name] = "*u8"
        elif name == "out_ptr":
            sig[name] = "*bf16" if constexprs.get("OUT_BF16") else "*fp32"
        else:
            sig[name] = _INT_ARGS.get(name, "*fp32")
    return sig


@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
def test_triton_kernels_compile_for_cuda():
    if not _triton_importable():
        pytest.skip("triton is not installed")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("kernels are decorated for the interpreter in this process")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("triton has no NVIDIA backend")
    from trl_entropy.kernels import _triton_ops as ops

    variants = []  # (arch, kernel, constexprs): every branch on sm_90, the full variants on sm_80 too
    for arch in (90, 80):
        for clamp in (True, False) if arch == 90 else (True,):
            consts = {"HAS_CLAMP": clamp, "BLOCK": 1024, **ops._selection_config(151936)}
            variants.append((arch, ops._forward_stats_kernel, consts))
        flags = [
            (True, True, True, True, True),
            (True, False, False, False, False),
            (False, True, False, True, False),
            (False, False, True, False, True),
        ]
        for has_lp, has_h, has_clamp, has_dtanh, out_bf16 in flags if arch == 90 else flags[:1]:
            consts = {
                "HAS_LP": has_lp,
                "HAS_H": has_h,
                "HAS_CLAMP": has_clamp,
                "HAS_DTANH": has_dtanh,
                "OUT_BF16": out_bf16,
                "BLOCK": 1024,
            }
            variants.append((arch, ops._grad_tile_kernel, consts))
    for arch, kernel, consts in variants:
        src = ASTSource(fn=kernel, signature=_signature(kernel, consts), constexprs=consts)
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32))
        assert "cubin" in compiled.asm, (kernel.__name__, consts, arch)


if __name__ == "__main__":
    interpreter_checks()
