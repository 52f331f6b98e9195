"""The fused kernel on the GPU against float64: fp32 and bf16 inputs, both backends, clamp off and on.

Skipped without CUDA. ``KERNEL_TEST_DEVICE=cpu`` runs the same table on the CPU (PyTorch backend only: the Triton
backend needs a GPU or the interpreter), which is how ``benchmarks/gpu_runbook.sh --dry-run`` checks this stage.
"""

import os

import pytest
import torch
from _reference.float64_reference import reference

from trl_entropy.kernels import chunked_logprob_entropy, logprob_entropy


DEVICE = os.environ.get("KERNEL_TEST_DEVICE", "cuda")
BACKENDS = ["torch", "triton"] if DEVICE == "cuda" else ["torch"]
OUTPUTS = ("log_probs", "entropy", "clamped_entropy")
N, D, V = 64, 64, 3000  # V > 2048: the PyTorch path's counting search, not kthvalue

pytestmark = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("clamp_fraction", [0.0, 0.3])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_matches_float64_on_device(dtype, backend, clamp_fraction):
    check_against_float64(dtype, backend, clamp_fraction)


@pytest.mark.parametrize("clamp", [0.0, 0.3], ids=["clamp0", "clamp0.3"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_backward_in_token_blocks_on_device(dtype, backend, clamp, logit_shapes, monkeypatch):
    """The backward in its own blocks of 32 tokens (2 blocks) by vocabulary tiles of 2048 + 952, each a GEMM of
    another shape than the forward's chunks of 24 tokens; with the clamp, the kept set from the forward's bits."""
    monkeypatch.setattr(logprob_entropy, "BACKWARD_TOKEN_BLOCK", 32)
    monkeypatch.setattr(logprob_entropy, "BACKWARD_MIN_WIDTH", 1024)
    check_against_float64(dtype, backend, clamp)
    # after the forward's 3 chunks of 24, 24 and 16
    assert logit_shapes[3:] == [(32, 2048), (32, 952)] * 2, logit_shapes


def check_against_float64(dtype, backend, clamp_fraction):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(N, D, generator=g, dtype=torch.float64).to(dtype)
    weight = (torch.randn(V, D, generator=g, dtype=torch.float64) * 0.3).to(dtype)
    bias = (torch.randn(V, generator=g, dtype=torch.float64) * 0.5).to(dtype)
    targets = torch.randint(0, V, (N,), generator=g)
    loss_weights = [torch.randn(N, generator=g, dtype=torch.float64) for _ in OUTPUTS]

    leaves = [t.to(DEVICE, copy=True).requires_grad_() for t in (hidden, weight, bias)]
    out = chunked_logprob_entropy(
        leaves[0],
        leaves[1],
        targets.to(DEVICE),
        bias=leaves[2],
        temperature=0.7,
        clamp_fraction=clamp_fraction,
        chunk_size=24,
        backend=backend,
    )
    sum((o.double().cpu() * w).sum() for o, w in zip(out, loss_weights)).backward()

    ref_leaves = [t.double().requires_grad_() for t in (hidden, weight, bias)]
    ref = reference(*ref_leaves[:2], targets, ref_leaves[2], temperature=0.7, clamp_fraction=clamp_fraction)
    sum((r * w).sum() for r, w in zip(ref, loss_weights)).backward()

    for name, a, b in zip(OUTPUTS, out, ref):
        assert a.dtype == torch.float32 and a.device.type == torch.device(DEVICE).type, name
        torch.testing.assert_close(a.double().cpu(), b.detach(), rtol=1e-5, atol=1e-5 * b.abs().max().item())
    rtol = 1e-5 if dtype == torch.float32 else 2e-2  # bf16 gradients: one final rounding (and bf16 GEMM operands)
    for name, leaf, ref_leaf in zip(("hidden", "weight", "bias"), leaves, ref_leaves):
        assert leaf.grad.dtype == dtype, name
        err = (leaf.grad.double().cpu() - ref_leaf.grad).abs().max().item()
        assert err <= rtol * ref_leaf.grad.abs().max().item(), f"grad {name}: {err:.3e}"
