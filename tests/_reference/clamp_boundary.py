"""The clamp's boundary on tied logits, for the PyTorch and the Triton kernel tests (imports nothing from the project,
so the Triton interpreter script can use it standalone).

The clamp drops every entry ``<=`` the row's k-th smallest logit ``z_(k)``, ``k = floor(p V)``: exactly ``k``
entries without a tie at the boundary, and the whole tie group when the k-th value is repeated across it (the
float64 reference does the same: ``z > sort(z)[k - 1]``). Tie-free logits cannot tell ``>`` from ``>=`` when the
threshold lands strictly between two logits, so these rows tie on purpose.

Logits are ``z = hidden * weight[:, 0]`` (d = 1): equal weights give bit-equal logits in every row, and every row
(positive ``hidden``) orders the vocabulary the same way, so ``weight.grad`` is zero exactly on the dropped entries.
"""

import math

import torch

from _reference.float64_reference import reference


CLAMP_FRACTION = 0.3
# 1-based ranks (in ascending order) made equal to one value; the row maximum stays above them
TIE_CASES = {
    "tie ends at k": lambda k: range(k - 1, k + 1),  # ranks k-1, k: exactly k dropped
    "tie straddles k": lambda k: range(k - 1, k + 3),  # ranks k-1..k+2: all four dropped, k+2 in all
    "tie starts at k": lambda k: range(k, k + 4),  # ranks k..k+3: k+3 dropped
    "tie starts after k": lambda k: range(k + 1, k + 5),  # the boundary itself untied: exactly k dropped
}
# Cases where no threshold can count exactly k entries, so the kernel's threshold is the k-th value itself: keeping
# entries ``>= threshold`` instead of ``> threshold`` must fail there, whichever way the threshold was found.
TIE_AT_THRESHOLD = ("tie straddles k", "tie starts at k")


def tied_inputs(case: str, vocab: int, n: int = 5, seed: int = 0):
    """``(hidden (n, 1), weight (V, 1), targets, dropped (V,) bool)`` in fp32 with the tie ``case``."""
    k = math.floor(CLAMP_FRACTION * vocab)
    g = torch.Generator().manual_seed(seed)
    values = torch.linspace(-2.0, 2.0, vocab, dtype=torch.float64)  # ascending, distinct
    ranks = torch.tensor(list(TIE_CASES[case](k))) - 1
    values[ranks] = values[k - 1].item()
    dropped = values <= values[k - 1]
    order = torch.randperm(vocab, generator=g)
    weight = values[order].float().unsqueeze(1)
    hidden = (0.5 + torch.rand(n, 1, generator=g, dtype=torch.float64)).float()
    targets = torch.randint(0, vocab, (n,), generator=g)
    return hidden, weight, targets, dropped[order]


def check_clamp_on_ties(kernel, case: str, vocab: int, **kwargs) -> None:
    """``kernel(hidden, weight, targets, clamp_fraction=...)`` (the fused kernel with a backend bound) against the
    float64 reference on the tie ``case``: the three outputs, and exactly the dropped entries without a gradient."""
    hidden, weight, targets, dropped = tied_inputs(case, vocab)
    k = math.floor(CLAMP_FRACTION * vocab)
    expected_dropped = int(dropped.sum())
    assert expected_dropped >= k, (expected_dropped, k)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    out = kernel(h, w, targets, clamp_fraction=CLAMP_FRACTION, **kwargs)
    ref = reference(hidden.double(), weight.double(), targets, clamp_fraction=CLAMP_FRACTION)
    for name, a, b in zip(("log_probs", "entropy", "clamped_entropy"), out, ref):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-6, msg=f"{case}, V={vocab}: {name}")
    out[2].sum().backward()
    grad = w.grad.squeeze(1)
    assert torch.equal(grad == 0, dropped), (
        f"{case}, V={vocab}: {int((grad == 0).sum())} entries without a clamped-entropy gradient, "
        f"{expected_dropped} expected (k = {k})"
    )
