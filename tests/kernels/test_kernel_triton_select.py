"""The Triton path's clamp threshold (the sampled-window selection of ``_forward_stats_kernel``) under the Triton
interpreter, at small sizes: the threshold is ``torch.kthvalue``'s k-th smallest value bit for bit (one float below the
row maximum when that is the k-th smallest: the max is always kept), and the kept set is the PyTorch path's, on every
route the selection takes: the window, brackets narrowed over it or copied out of it, and the whole row where the
window misses the k-th smallest or overflows.

Triton reads ``TRITON_INTERPRET`` when the kernels are decorated, so ``test_selection_under_the_interpreter`` runs
this file's other tests in a pytest subprocess with it set; under ``TRITON_INTERPRET=1`` they run in this process.
"""

import dataclasses
import importlib.util
import math
import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from _reference.select_reference import sampled_window, sort_keys, threshold_keys
from _support.interpreter import reduce_xor_sums_with_numpy, rerun_under_the_interpreter, use_interpreter_tiles

from trl_entropy.kernels import _torch_ops


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
TRITON_OPS = Path(__file__).resolve().parents[2] / "trl_entropy" / "kernels" / "_triton_ops.py"
# the row sums of a row with -inf entries hold 0 * inf (this file checks thresholds and kept sets only)
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
interpreted = pytest.mark.skipif(
    not INTERPRETED, reason="needs TRITON_INTERPRET=1 (test_selection_under_the_interpreter sets it)"
)
if INTERPRETED:
    reduce_xor_sums_with_numpy()


def test_selection_under_the_interpreter():
    rerun_under_the_interpreter(__file__)


def _load_ops(source: str | None = None):
    """``_triton_ops`` loaded on its own, decorated for the interpreter, with the interpreter's tiles; from ``source``
    when given (a copy with a planted bug, written to a file: Triton reads a kernel's source)."""
    path = TRITON_OPS
    if source is not None:
        path = Path(tempfile.mkdtemp()) / "_triton_ops_planted.py"
        path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"triton_ops_{len(str(path))}_{id(source)}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass's annotations resolve through it
    spec.loader.exec_module(module)
    use_interpreter_tiles(module)
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
    n, vocab = z.shape
    targets = torch.arange(n) * 7 % vocab
    n_bytes = (vocab + 7) // 8
    bits = torch.full((n, n_bytes + 3), 0xAB, dtype=torch.uint8)  # a row stride wider than the bits
    out = ops.forward_stats(z, targets, k, None, bits[:, :n_bytes])
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
    # the kept set's bits: bit j of byte b is column 8 b + j, the last byte's high bits 0
    padded = torch.zeros(n, 8 * n_bytes, dtype=torch.long)
    padded[:, :vocab] = kept.long()
    want_bits = (padded.view(n, n_bytes, 8) << torch.arange(8)).sum(2)
    assert torch.equal(bits[:, :n_bytes].long(), want_bits), f"{what} V={vocab} k={k}: the kept set's bits"
    assert (bits[:, n_bytes:] == 0xAB).all(), f"{what} V={vocab} k={k}: bits written past the row's bytes"


def _misleading_sample(vocab, k, g):
    """Rows whose sampled columns hold the row's largest (first row) or smallest (second) values: the window then
    misses the k-th smallest, and the selection reads the whole row."""
    z = torch.randn(2, vocab, generator=g)
    at = torch.unique((torch.arange(512) * vocab) // 512)
    z[0, at], z[1, at] = 10 + torch.rand(at.numel(), generator=g), -10 - torch.rand(at.numel(), generator=g)
    return z


ROWS["misleading sample"] = _misleading_sample


# ---------------------------------------------------------------------------------------------------------------------
# The cases
# ---------------------------------------------------------------------------------------------------------------------
@interpreted
@pytest.mark.parametrize("vocab", [5, 300, 2500])
def test_threshold_is_kthvalue_and_kept_set_is_the_torch_paths(ops, vocab):
    """Default sizes (tiled for the interpreter): a sample of 512 columns (with repeats below V = 512), windows of up
    to V/4 entries and brackets of up to 4096 copied entries."""
    for k in _ks(vocab):
        z, labels = _batch(vocab, k)
        _check(ops, z, k, labels)


@interpreted
@pytest.mark.parametrize("vocab", [5, 300])
def test_whole_row_selection(ops, monkeypatch, vocab):
    """Windows of one entry: nearly every row overflows its window and narrows over the whole row, in blocks of 64
    columns."""
    monkeypatch.setattr(ops, "SELECTION", dataclasses.replace(ops.SELECTION, sel_block=64, window_cap=1))
    for k in sorted({1, 2, vocab // 3, vocab - 2, vocab - 1} & set(_ks(vocab))):
        z, labels = _batch(vocab, k, seed=1)
        _check(ops, z, k, labels, "windows of one entry:")


@interpreted
@pytest.mark.parametrize("bracket", [1, 3, 40])
def test_brackets_copied_late_or_never(ops, monkeypatch, bracket):
    """Copied brackets of 1, 3 and 40 entries at most: the rounds go on over the window until the bracket fits (or
    ends), with blocks of 16 columns."""
    monkeypatch.setattr(ops, "SELECTION", dataclasses.replace(ops.SELECTION, sel_block=16, bracket=bracket))
    for k in (1, 100, 298):
        z, labels = _batch(300, k, seed=2)
        _check(ops, z, k, labels, f"brackets of {bracket}:")


@interpreted
def test_scratch_rows_hold_each_rows_window_in_row_order_and_its_sorted_sample(ops):
    """The scratch row starts with the row's window (the entries between the sampled ``lo`` and ``hi``) in row order,
    where the k-th smallest is in it, and ends with the sorted sample. ``sampled_window`` recomputes the window from
    the definition, so the kernel's sample, ranks and bounds are checked, not only its result."""
    vocab, k = 2500, 800
    g = torch.Generator().manual_seed(4)
    z = torch.cat([torch.randn(4, vocab, generator=g) * 3, _misleading_sample(vocab, k, g)])
    per_row = ops.scratch_per_row(vocab)
    work = torch.full((z.shape[0] * per_row,), math.nan)
    ops.forward_stats(z, torch.zeros(z.shape[0], dtype=torch.long), k, work)
    windows = sampled_window(z, k, ops.SELECTION.sample, ops.window_span(k, vocab))
    assert [w is None for w in windows] == [False] * 4 + [True] * 2, "the misleading samples' windows miss"
    sample_at = (torch.arange(ops.SELECTION.sample) * vocab) // ops.SELECTION.sample
    for i, (scratch, window) in enumerate(zip(work.view(-1, per_row), windows)):
        if window is not None:
            assert 0 < window.numel() < vocab // 4, f"row {i}: a window of {window.numel()} entries"
            assert torch.equal(scratch[: window.numel()], window), f"row {i}: the window"
        sorted_sample = z[i, sample_at].sort().values
        assert torch.equal(scratch[-ops.SELECTION.sample :], sorted_sample), f"row {i}: the sorted sample"


# ---------------------------------------------------------------------------------------------------------------------
# Planted bugs must fail the checks above
# ---------------------------------------------------------------------------------------------------------------------
PLANTS = {
    "entries equal to the window's lower end counted inside it": (
        "n_below += (msk & (kz <= lo)).to(tl.int32)",
        "n_below += (msk & (kz < lo)).to(tl.int32)",
    ),
    "a round's lower end moved to a probe whose count reaches k": (
        "a = tl.maximum(a, tl.max(tl.where(le < k, pts, a), axis=0))",
        "a = tl.maximum(a, tl.max(tl.where(le <= k, pts, a), axis=0))",
    ),
    "the copied bracket without its upper end": (
        "inb = (offs < n_src) & (kw > a.to(tl.int32)) & (kw <= b.to(tl.int32))",
        "inb = (offs < n_src) & (kw > a.to(tl.int32)) & (kw < b.to(tl.int32))",
    ),
    "negative keys not flipped in a round's count": (
        "kw = tl.where(bw < 0, bw ^ 0x7FFFFFFF, bw)\n                inside",
        "kw = bw\n                inside",
    ),
    "the max not kept when it is the k-th smallest": (
        "thr_key = tl.minimum(b, key_max - 1)",
        "thr_key = b",
    ),
    "the whole row's selection starting at the sample minimum's key, not below every key": (
        "a = tl.where(in_window, lo, -2147483648).to(tl.int64)",
        "a = tl.where(in_window, lo, tl.min(s_key, axis=0)).to(tl.int64)",
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
        for sizes in (planted.SELECTION, dataclasses.replace(planted.SELECTION, sel_block=64, window_cap=1)):
            planted.SELECTION = sizes
            for vocab in (5, 300):
                for k in _ks(vocab):
                    z, labels = _batch(vocab, k)
                    _check(planted, z, k, labels)
