"""The Triton path's clamp threshold (the radix select of ``_forward_stats_kernel``) under the Triton interpreter, at
small sizes: the threshold is ``torch.kthvalue``'s k-th smallest value bit for bit (one float below the row maximum
when that is the k-th smallest: the max is always kept), and the kept set is the PyTorch path's.

Triton reads ``TRITON_INTERPRET`` when the kernels are decorated, so ``test_radix_select_under_the_interpreter`` runs
this file's other tests in a pytest subprocess with it set; under ``TRITON_INTERPRET=1`` they run in this process.
"""

import importlib.util
import math
import os
import tempfile
from pathlib import Path

import pytest
import torch
from _reference.select_reference import first_bucket_sizes, sort_keys, threshold_keys
from _support.interpreter import rerun_under_the_interpreter

from trl_entropy.kernels import _torch_ops


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
TRITON_OPS = Path(__file__).resolve().parents[2] / "trl_entropy" / "kernels" / "_triton_ops.py"
# the row sums of a row with -inf entries hold 0 * inf (this file checks thresholds and kept sets only)
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
interpreted = pytest.mark.skipif(
    not INTERPRETED, reason="needs TRITON_INTERPRET=1 (test_radix_select_under_the_interpreter sets it)"
)


def test_radix_select_under_the_interpreter():
    rerun_under_the_interpreter(__file__)


def _load_ops(source: str | None = None):
    """``_triton_ops`` loaded on its own, decorated for the interpreter; from ``source`` when given (a copy with a
    planted bug, written to a file: Triton reads a kernel's source)."""
    path = TRITON_OPS
    if source is not None:
        path = Path(tempfile.mkdtemp()) / "_triton_ops_planted.py"
        path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"triton_ops_{len(str(path))}_{id(source)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ops():
    return _load_ops()


# ---------------------------------------------------------------------------------------------------------------------
# Rows: each builder gives (rows, V) fp32 for a vocabulary and a k
# ---------------------------------------------------------------------------------------------------------------------
def _min_tied(vocab, k, g, times):
    z = torch.randn(2, vocab, generator=g) * 3
    low = z.amin(1, keepdim=True) - torch.tensor([[1.0], [0.5]])
    where = torch.rand(2, vocab, generator=g).argsort(1)[:, : min(times, vocab - 1)]
    return z.scatter_(1, where, low.expand_as(where).contiguous())


def _just_above_min(vocab, k, g):
    """The row minimum ``a`` and the next float above it, ``a`` negative and positive (the key flip's two sides)."""
    z = torch.randn(2, vocab, generator=g) * 3 + torch.tensor([[0.0], [20.0]])
    a = z.amin(1) - 1
    z[:, 0], z[:, vocab // 2] = a, torch.nextafter(a, torch.full_like(a, math.inf))
    return z


def _top_tied(vocab, k, g):
    """The max tied (twice, and three times), and the max with the next float below it."""
    z = torch.randn(3, vocab, generator=g) * 3
    top = z.amax(1) + 1
    z[:, 1], z[:, vocab - 1] = top, top
    z[1, 2] = top[1]
    z[2, vocab - 1] = torch.nextafter(top[2], torch.tensor(-math.inf))
    return z


def _minus_inf(vocab, k, g):
    z = torch.randn(3, vocab, generator=g)
    z[0, : max(1, vocab // 10)] = -math.inf
    z[1, : vocab // 2] = -math.inf
    z[2, ::2] = -math.inf
    return z


ROWS = {
    "random fp32": lambda vocab, k, g: torch.randn(3, vocab, generator=g) * 3,
    "bf16 values": lambda vocab, k, g: (torch.randn(3, vocab, generator=g) * 3).bfloat16().float(),
    "constant rows": lambda vocab, k, g: torch.tensor([[1.5], [-2.25], [0.0], [3e38]]).expand(4, vocab).clone(),
    "-inf entries": _minus_inf,
    "signs and magnitudes": lambda vocab, k, g: (
        torch.randn(3, vocab, generator=g).sign() * (torch.randn(3, vocab, generator=g) * 6).exp()
    ),
    "one first digit": lambda vocab, k, g: (
        (1 + 0.2 * torch.rand(2, vocab, generator=g)) * torch.tensor([[1.0], [-1.0]])
    ),
    "minimum tied k-1 times": lambda vocab, k, g: _min_tied(vocab, k, g, k - 1),
    "minimum tied k times": lambda vocab, k, g: _min_tied(vocab, k, g, k),
    "minimum tied k+1 times": lambda vocab, k, g: _min_tied(vocab, k, g, k + 1),
    "just above the minimum": _just_above_min,
    "maximum tied or next to its float": _top_tied,
}


def _ks(vocab):
    return sorted({k for k in (1, 2, 3, vocab // 3, vocab // 2, vocab - 3, vocab - 2, vocab - 1) if 1 <= k < vocab})


def _batch(vocab, k, seed=0):
    """Every kind of row for this ``k``, stacked, and each row's kind."""
    g = torch.Generator().manual_seed(seed * 7919 + vocab * 31 + k)
    parts = {name: build(vocab, k, g) for name, build in ROWS.items()}
    labels = [name for name, part in parts.items() for _ in range(part.shape[0])]
    return torch.cat(list(parts.values())), labels


def _check(ops, z, k, labels, what=""):
    """The kernel's threshold and kept set on rows ``z`` against ``torch.kthvalue`` and the PyTorch path."""
    n = z.shape[0]
    targets = torch.arange(n) * 7 % z.shape[1]
    out = ops.forward_stats(z, targets, k)
    got = sort_keys(out["thr"])
    want = threshold_keys(z, k)
    bad = [labels[i] for i in (got != want).nonzero().flatten().tolist()]
    assert not bad, f"{what} V={z.shape[1]} k={k}: thresholds differ from kthvalue's on {bad}"
    kept = sort_keys(z) > got.unsqueeze(1)
    torch_thr = _torch_ops.forward_stats(z.clone(), targets, k, torch.empty(2 * z.numel()))["thr"]
    torch_kept = _torch_ops.kept_mask(z, torch_thr)
    bad = [labels[i] for i in (kept != torch_kept).any(1).nonzero().flatten().tolist()]
    assert not bad, f"{what} V={z.shape[1]} k={k}: kept sets differ from the PyTorch path's on {bad}"
    assert torch.equal(out["kept_t"], kept[torch.arange(n), targets].float()), f"{what} V={z.shape[1]} k={k}: kept_t"


# ---------------------------------------------------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------------------------------------------------
@interpreted
@pytest.mark.parametrize("vocab", [5, 300, 2500])
def test_threshold_is_kthvalue_and_kept_set_is_the_torch_paths(ops, vocab):
    """Default configuration: at V = 2500 a selection block of 1024 and a scratch row of V/4 (the "one first digit"
    rows overflow it and take the fallback pass)."""
    for k in _ks(vocab):
        z, labels = _batch(vocab, k)
        _check(ops, z, k, labels)


@interpreted
@pytest.mark.parametrize("vocab", [5, 300])
def test_small_selection_blocks_and_scratch_rows(ops, monkeypatch, vocab):
    """Selection blocks of 64 columns (the compaction crosses several blocks) and scratch rows of V/8 and of 3 entries
    (nearly every bucket overflows: the fallback)."""
    for per_row in (-(-vocab // 8), 3):
        monkeypatch.setattr(ops, "SELECTION_OVERRIDE", (64, per_row))
        for k in sorted({1, 2, vocab // 3, vocab - 2, vocab - 1} & set(_ks(vocab))):
            z, labels = _batch(vocab, k, seed=1)
            _check(ops, z, k, labels, f"blocks of 64, {per_row} scratch entries per row:")


@interpreted
@pytest.mark.parametrize("sel_block", [16, 128])
def test_scratch_row_just_fits_or_just_overflows(ops, monkeypatch, sel_block):
    """Scratch rows one entry short of the first bucket, exactly its size and one entry more."""
    vocab = 400
    g = torch.Generator().manual_seed(3)
    z = torch.cat([torch.randn(2, vocab, generator=g), (torch.randn(2, vocab, generator=g) * 3).bfloat16().float()])
    for k in (1, 130, vocab - 1):
        for i, size in enumerate(first_bucket_sizes(z, k).tolist()):
            for per_row in (size - 1, size, size + 1):
                monkeypatch.setattr(ops, "SELECTION_OVERRIDE", (sel_block, max(per_row, 1)))
                _check(ops, z[i : i + 1], k, [f"row {i}"], f"{per_row} scratch entries (bucket {size}):")


@interpreted
def test_scratch_rows_hold_each_rows_first_bucket_in_row_order(ops, monkeypatch):
    """Each row's scratch row gets exactly the entries of its first bucket, in row order, when they fit; a row whose
    bucket does not fit leaves its scratch row untouched."""
    vocab, k, per_row = 600, 200, 60
    g = torch.Generator().manual_seed(4)
    z = torch.cat([torch.randn(4, vocab, generator=g) * 3, 1 + 0.2 * torch.rand(1, vocab, generator=g)])
    monkeypatch.setattr(ops, "SELECTION_OVERRIDE", (64, per_row))
    work = torch.full((z.shape[0] * per_row,), math.nan)
    ops.forward_stats(z, torch.zeros(z.shape[0], dtype=torch.long), k, work)
    kth = sort_keys(torch.kthvalue(z, k, dim=1).values)
    in_bucket = (sort_keys(z) >> 21) == (kth >> 21).unsqueeze(1)
    fitting = 0
    for i, scratch in enumerate(work.view(-1, per_row)):
        bucket = z[i][in_bucket[i]]
        if bucket.numel() <= per_row:
            fitting += 1
            assert torch.equal(scratch[: bucket.numel()], bucket), f"row {i}"
            assert scratch[bucket.numel() :].isnan().all(), f"row {i}: written past its bucket"
        else:
            assert scratch.isnan().all(), f"row {i}: an overflowing bucket was written"
    assert 0 < fitting < z.shape[0], "both kinds of row"


# ---------------------------------------------------------------------------------------------------------------------
# Planted bugs must fail the checks above
# ---------------------------------------------------------------------------------------------------------------------
PLANTS = {
    "first digit: the first bucket whose count reaches k + 1": (
        "prefix_hi = tl.sum((cum < k).to(tl.int32), axis=0) - 1024",
        "prefix_hi = tl.sum((cum <= k).to(tl.int32), axis=0) - 1024",
    ),
    "the max not kept when it is the k-th smallest": (
        "thr_key = tl.minimum(kth_key, key_max - 1)",
        "thr_key = kth_key",
    ),
    "negative keys not flipped in the last digit's pass": (
        "kz = tl.where(bz < 0, bz ^ 0x7FFFFFFF, bz)\n            hist_lo",
        "kz = bz\n            hist_lo",
    ),
}


@interpreted
@pytest.mark.parametrize("plant", list(PLANTS))
def test_planted_bug_fails_the_checks(plant):
    old, new = PLANTS[plant]
    source = TRITON_OPS.read_text()
    assert source.count(old) == 1, f"not found once in _triton_ops.py: {old}"
    planted = _load_ops(source.replace(old, new))
    with pytest.raises(AssertionError):
        for vocab in (5, 300):
            for k in _ks(vocab):
                z, labels = _batch(vocab, k)
                _check(planted, z, k, labels)
