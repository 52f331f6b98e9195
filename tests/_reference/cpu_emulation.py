"""Running and measuring the CUDA bf16/fp16 path of the kernel on a CPU (for tests and the benchmark).

On CUDA, bf16/fp16 operands are multiplied by ``torch.mm``/``torch.addmm`` with ``out_dtype=torch.float32``, which
the CPU build does not provide. :func:`emulate_fp32_output_gemm` stands in for them exactly (bf16/fp16 values are
exact in fp32, and the products are accumulated in fp32 like the real ones), so that path's control flow and
buffers run on the CPU. :class:`TensorAllocations` records every tensor storage allocated by an ATen op while it
is active, and the peak of the bytes still alive, which is what the CUDA caching allocator's peak counts.
"""

from __future__ import annotations

import contextlib
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class TensorAllocations(TorchDispatchMode):
    """Storages allocated by ATen ops inside the ``with`` block (forward and backward alike).

    ``sizes`` lists each new storage's bytes in order, ``live`` is what is still allocated, ``peak`` the maximum of
    ``live``. Outputs that reuse an input's storage (views, in-place ops, ``out=``) are not new. Tensors allocated
    before the block are not counted. Inside :meth:`paused` nothing is recorded.
    """

    def __init__(self):
        super().__init__()
        self.sizes: list[int] = []
        self.live = 0
        self.peak = 0
        self._paused = False

    @contextlib.contextmanager
    def paused(self):
        previous, self._paused = self._paused, True
        try:
            yield
        finally:
            self._paused = previous

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if torch.is_tensor(t)}
        out = func(*args, **kwargs)
        if not self._paused:
            for t in tree_flatten(out)[0]:
                if torch.is_tensor(t) and t.untyped_storage().data_ptr() not in inputs:
                    self._allocated(t.untyped_storage())
        return out

    def _allocated(self, storage) -> None:
        nbytes = storage.nbytes()
        if nbytes == 0:
            return
        self.sizes.append(nbytes)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._freed, nbytes)

    def _freed(self, nbytes: int) -> None:
        self.live -= nbytes


@contextlib.contextmanager
def emulate_fp32_output_gemm(allocations: TensorAllocations | None = None, logprob_entropy=None):
    """Run the kernel's CUDA bf16/fp16 path on CPU tensors. Yields the list of emulated GEMM calls.

    ``logprob_entropy``: the kernel module whose path is switched (default ``trl_entropy.kernels.logprob_entropy``; the
    Triton interpreter script passes its standalone copy, loaded without the package).

    ``torch.mm``/``torch.addmm`` with ``out_dtype=torch.float32`` are emulated (operands upcast to fp32, product
    accumulated in fp32); the fp32 operand copies are an artefact of the emulation (the CUDA GEMM reads bf16 directly)
    and are not recorded in ``allocations``. A result the real op would allocate (no ``out=``) is recorded.
    """
    if logprob_entropy is None:
        from trl_entropy.kernels import logprob_entropy
    original_mm, original_addmm, original_fast_half = torch.mm, torch.addmm, logprob_entropy._fast_half
    calls: list[str] = []
    not_recorded = allocations.paused if allocations is not None else contextlib.nullcontext

    def check(a, b, out_dtype, out):
        assert a.dtype == b.dtype and a.dtype in (torch.bfloat16, torch.float16), (a.dtype, b.dtype)
        assert out_dtype == torch.float32 and (out is None or out.dtype == torch.float32)

    def mm(a, b, *args, out_dtype=None, out=None, **kwargs):
        if out_dtype is None:
            return original_mm(a, b, *args, out=out, **kwargs) if out is not None else original_mm(a, b, *args)
        check(a, b, out_dtype, out)
        calls.append("mm" if out is None else "mm(out=)")
        if out is None:
            out = torch.empty(a.shape[0], b.shape[1], dtype=out_dtype)
        with not_recorded():
            original_mm(a.float(), b.float(), out=out)
        return out

    def addmm(acc, a, b, *args, out_dtype=None, out=None, **kwargs):
        if out_dtype is None:
            if out is not None:
                return original_addmm(acc, a, b, *args, out=out, **kwargs)
            return original_addmm(acc, a, b, *args, **kwargs)
        check(a, b, out_dtype, out)
        assert not args and not kwargs, "alpha/beta with out_dtype are not used by the kernel"
        calls.append("addmm" if out is None else "addmm(out=)")
        if out is None:
            out = torch.empty(a.shape[0], b.shape[1], dtype=out_dtype)
        with not_recorded():
            original_addmm(acc.float(), a.float(), b.float(), out=out)
        return out

    torch.mm, torch.addmm = mm, addmm
    logprob_entropy._fast_half = lambda t: t.dtype in (torch.bfloat16, torch.float16)
    try:
        yield calls
    finally:
        torch.mm, torch.addmm, logprob_entropy._fast_half = original_mm, original_addmm, original_fast_half
