"""The gradient step's half-precision output against a separate product and rounding in torch, for both backends'
tests (imports nothing from the project, so the Triton interpreter script can use it standalone)."""

import torch


def grad_tile_coefficients(n, columns, seed=0):
    """Every per-row coefficient ``grad_tile`` reads (random), and kept bits for ``columns`` columns."""
    g = torch.Generator().manual_seed(seed)
    coef = {
        name: torch.randn(n, generator=g)
        for name in ("neg_logs", "a0", "b0", "g_lp", "om", "g_h", "ybar", "da", "db", "g_cr", "ybar_c")
    }
    coef["m"] = torch.full((n,), 3.0)
    coef["neg_logs"] = -coef["neg_logs"].abs() - 4.0
    coef["kept_bits"] = torch.randint(0, 256, (n, (columns + 7) // 8), generator=g, dtype=torch.uint8)
    return coef


def check_grad_tile_rounds_like_torch(ops):
    """The gradient step's half-precision output, ``scale * dL/dz * dtanh`` rounded to bf16 (in the Triton kernel) or
    fp16, equals the fp32 gradient it writes otherwise, times ``dtanh`` and ``scale`` in torch and rounded by torch,
    bit for bit (one fp32 rounding per product, round-to-nearest-even). Columns 100 to 400 of a 450-entry row. Each
    call gets its own ``work`` buffer (the torch path returns its fp32 gradient in it; the Triton path needs none)."""
    n, start, width = 6, 100, 300
    g = torch.Generator().manual_seed(9)
    z = torch.randn(n, width, generator=g) * 2
    targets = torch.tensor([0, 150, 399, 5, 250, 449])  # in the tile, at its ends, before and after it
    dtanh = torch.rand(n, width, generator=g)
    coef = grad_tile_coefficients(n, 450)

    def work():
        return torch.empty(3 * n * width)

    for dtype in (torch.bfloat16, torch.float16):
        for scale in (1.0, 0.3, 1 / 7):
            half = torch.empty(n, width, dtype=dtype)
            fused = ops.grad_tile(z.clone(), start, targets, coef, work(), dtanh, half, scale)
            fp32 = ops.grad_tile(z.clone(), start, targets, coef, work(), dtanh)
            assert fused is half and fp32.dtype == torch.float32
            want = torch.mul(fp32, scale, out=torch.empty(n, width, dtype=dtype))
            assert torch.equal(fused, want), f"{dtype}, scale {scale}: {(fused.float() - want.float()).abs().max()}"
            bare = ops.grad_tile(z.clone(), start, targets, coef, work())  # no dtanh: dL/dz
            assert torch.equal(bare * dtanh, fp32), "dtanh is one fp32 product"
