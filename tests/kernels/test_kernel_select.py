"""The clamp's threshold search (``trl_entropy/kernels/_select.py``) and the clamp's boundary on tied logits (PyTorch
path; the
Triton path runs the same boundary checks in ``test_kernel_triton.py``'s interpreter script)."""

import functools
import math

import pytest
import torch
from _reference import select_reference
from _reference.clamp_boundary import TIE_AT_THRESHOLD, TIE_CASES, check_clamp_on_ties
from torch.utils._python_dispatch import TorchDispatchMode

from trl_entropy.kernels import _torch_ops, chunked_logprob_entropy
from trl_entropy.kernels._select import kth_smallest_threshold


# ---------------------------------------------------------------------------------------------------------------------
# The search: the same selected set as torch.kthvalue and as the previous loop, for any number of passes
# ---------------------------------------------------------------------------------------------------------------------
def _rows(kind: str, vocab: int, n: int = 7, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + vocab)
    if kind == "gaussian":
        return torch.randn(n, vocab, generator=g) * 3
    if kind == "skewed":
        return -(torch.randn(n, vocab, generator=g).exp() * 3) + torch.randn(n, 1, generator=g)
    if kind == "ties":  # a few distinct values: ties straddle every rank
        return torch.randint(0, 5, (n, vocab), generator=g).float()
    if kind == "constant rows":
        return torch.full((n, vocab), 1.5).index_put_((torch.tensor([0]),), torch.randn(1, vocab, generator=g))
    if kind == "-inf entries":  # masked vocabulary entries, fewer and more than k of them
        z = torch.randn(n, vocab, generator=g)
        z[:, : vocab // 10] = -math.inf
        z[n // 2 :, : vocab // 2] = -math.inf
        return z
    raise ValueError(kind)


KINDS = ("gaussian", "skewed", "ties", "constant rows", "-inf entries")


@pytest.mark.parametrize("host_bookkeeping", [True, False], ids=["numpy bookkeeping", "device bookkeeping"])
@pytest.mark.parametrize("passes", [1, 3, 6, 12])
@pytest.mark.parametrize("vocab", [2, 7, 300, 2500, 9000])
@pytest.mark.parametrize("kind", KINDS)
def test_threshold_selects_what_kthvalue_and_the_previous_loop_select(kind, vocab, passes, host_bookkeeping):
    z = _rows(kind, vocab)
    for fraction in (0.01, 0.3, 0.5, 0.999):
        k = max(1, min(vocab - 1, math.floor(fraction * vocab)))
        thr = kth_smallest_threshold(z, k, passes=passes, host_bookkeeping=host_bookkeeping)
        kth = torch.kthvalue(z, k, dim=1).values
        assert torch.equal(z <= thr[:, None], z <= kth[:, None]), (kind, vocab, k)
        previous = select_reference.kth_smallest_threshold(z, k)
        assert torch.equal(z <= thr[:, None], z <= previous[:, None]), (kind, vocab, k)


@pytest.mark.parametrize("host_bookkeeping", [True, False], ids=["numpy bookkeeping", "device bookkeeping"])
@pytest.mark.parametrize("block_rows", [1, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_threshold_is_the_same_by_row_blocks(kind, block_rows, host_bookkeeping):
    """The CPU runs the passes block by block (cache-sized); any block size selects the same set (here the rows of
    every kind are mixed, so that blocks hold different kinds)."""
    z = torch.cat([_rows(other, 9000, n=3) for other in KINDS])
    z = z[torch.randperm(z.shape[0], generator=torch.Generator().manual_seed(len(kind)))]
    for fraction in (0.01, 0.3, 0.999):
        k = math.floor(fraction * 9000)
        thr = kth_smallest_threshold(z, k, passes=3, block_rows=block_rows, host_bookkeeping=host_bookkeeping)
        kth = torch.kthvalue(z, k, dim=1).values
        assert torch.equal(z <= thr[:, None], z <= kth[:, None]), (kind, block_rows, k)
        whole = kth_smallest_threshold(z, k, passes=3, block_rows=z.shape[0])
        assert torch.equal(z <= thr[:, None], z <= whole[:, None])


def test_kernel_by_row_blocks_matches_one_block(monkeypatch):
    """The forward's element-wise work and the backward's gradient tile run by row blocks on the CPU: blocks of one
    or a few rows give the same outputs and gradients as one block per chunk (up to summation order)."""
    g = torch.Generator().manual_seed(5)
    n, d, vocab = 13, 16, 3000
    hidden = torch.randn(n, d, generator=g)
    weight = torch.randn(vocab, d, generator=g) * 0.5
    bias = torch.randn(vocab, generator=g) * 0.1
    targets = torch.randint(0, vocab, (n,), generator=g)

    def run():
        h, w, b = (t.clone().requires_grad_(True) for t in (hidden, weight, bias))
        outs = torch_kernel(h, w, targets, bias=b, clamp_fraction=0.3, chunk_size=5)
        sum(o.sum() * (i + 1) for i, o in enumerate(outs)).backward()
        return [*outs, h.grad, w.grad, b.grad]

    monkeypatch.setattr(_torch_ops, "BLOCK_BYTES_CPU", 1 << 30)
    whole = run()
    for block_bytes in (1, 3 * 4 * vocab):
        monkeypatch.setattr(_torch_ops, "BLOCK_BYTES_CPU", block_bytes)
        for got, want in zip(run(), whole):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_backward_clamp_term_per_row_equals_the_batched_one():
    """On the CPU the backward forms the clamp's ``da + db·y`` by one fused ``add(…, alpha=db)`` per row, a GPU by one
    ``addcmul`` with per-row operands: both round once, so the gradient tile is bit for bit the same either way."""
    g = torch.Generator().manual_seed(7)
    n, width = 5, 700
    z = torch.randn(n, width, generator=g) * 4
    targets = torch.randint(0, width, (n,), generator=g)
    coef = {
        name: torch.randn(n, generator=g) for name in ("neg_logs", "a0", "b0", "da", "db", "g_lp", "om", "g_h", "ybar")
    }
    coef.update(
        m=z.amax(1), thr=torch.kthvalue(z, 200, dim=1).values, g_cr=torch.randn(n, generator=g), ybar_c=torch.randn(n)
    )
    tiles = []
    for db_rows in (None, coef["db"].tolist()):
        p, c, d = (torch.empty(n, width) for _ in range(3))
        tiles.append(_torch_ops._grad_rows(z.clone(), 0, targets, coef, p, c, d, db_rows))
    assert torch.equal(tiles[0], tiles[1])


def test_host_bookkeeping_needs_a_cpu_tensor():
    z = torch.empty(3, 4096, device="meta")
    with pytest.raises(ValueError, match="host_bookkeeping=True needs z on the CPU"):
        kth_smallest_threshold(z, 100, host_bookkeeping=True)


_HOST_READS = {"_local_scalar_dense", "nonzero", "masked_select", "bincount", "unique", "repeat_interleave"}


class HostReads(TorchDispatchMode):
    """Counts the ATen ops that copy a value to the host (a GPU stalls on each): ``.item()``/``bool()``/``int()``
    (``_local_scalar_dense``), ``nonzero`` and the ops whose output size depends on the data, and copies to the CPU."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in _HOST_READS or (name in ("_to_copy", "copy_") and (kwargs or {}).get("device") is not None):
            self.ops.append(name)
        if name == "index" and any(t is not None and t.dtype == torch.bool for t in args[1]):
            self.ops.append("index with a mask")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", ["gaussian", "ties"])
def test_search_reads_the_host_a_fixed_number_of_times_whatever_the_passes(kind):
    """No host read inside the loop: with 2 passes or 24, at most four per call (how many rows end each way, then
    ``nonzero`` for which rows, for the segments that hold their bracket's entries and for those entries). The
    bookkeeping stays on the tensors' device, as it does on a GPU (on the CPU it runs in NumPy, on the same memory)."""
    z = _rows(kind, 9000, n=16)
    k = math.floor(0.3 * 9000)
    counts = {}
    for passes in (2, 24):
        with HostReads() as reads:
            kth_smallest_threshold(z, k, passes=passes, host_bookkeeping=False)
        counts[passes] = reads.ops
    assert counts[2] and all(len(ops) <= 4 for ops in counts.values()), counts


def test_host_read_counter_sees_item_bool_and_nonzero():
    z = torch.randn(3, 5)
    with HostReads() as reads:
        bool((z > 0).any())
        z.sum().item()
        (z > 0).nonzero()
        _ = z[z > 0]
    assert len(reads.ops) >= 4, reads.ops


# ---------------------------------------------------------------------------------------------------------------------
# The clamp's boundary on tied logits, against float64; a planted ">=" must fail
# ---------------------------------------------------------------------------------------------------------------------
torch_kernel = functools.partial(chunked_logprob_entropy, backend="torch")
VOCABS = [64, 2500]  # torch.kthvalue for short rows; the counting search from 1024 entries on


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("case", list(TIE_CASES))
def test_clamp_on_tied_logits_matches_float64(case, vocab):
    check_clamp_on_ties(torch_kernel, case, vocab)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("case", TIE_AT_THRESHOLD)
def test_keeping_entries_equal_to_the_threshold_fails_the_tie_checks(case, vocab, monkeypatch):
    """The bug the tie checks are there for: keeping ``z >= threshold`` (dropping k - 1 entries, or fewer with ties)
    instead of ``z > threshold``. Planted here, it must fail them."""
    original = _torch_ops.kept_mask

    def kept_ge(z, thr, out=None):
        equal = z == (thr.unsqueeze(1) if z.dim() == 2 else thr)  # before ``out``, which may be ``z`` itself
        kept = original(z, thr, out=out)
        return kept.masked_fill_(equal, True if kept.dtype == torch.bool else 1.0)

    monkeypatch.setattr(_torch_ops, "kept_mask", kept_ge)
    with pytest.raises(AssertionError):
        check_clamp_on_ties(torch_kernel, case, vocab)
