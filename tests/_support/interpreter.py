"""A kernel test file's Triton cases run again under the Triton interpreter, in a child process: Triton reads
``TRITON_INTERPRET`` when its kernels are first decorated, so this process (which may have compiled them already)
cannot switch.

The interpreter runs a kernel's programs one grid point at a time, each ``tl`` operation a numpy call on the block,
so its cost is the number of operations the programs run, whatever their size. Two changes make the interpreted cases
cheaper (40 % of their CPU time before) and leave every case, every branch and every value as it was:
:func:`use_interpreter_tiles` and :func:`reduce_xor_sums_with_numpy`."""

import dataclasses
import importlib.util
import os
import sys
from pathlib import Path

import pytest

from _support.watchdog import run_watched


ROOT = Path(__file__).resolve().parents[2]


def rerun_under_the_interpreter(test_file: str) -> None:
    """Run ``test_file`` with ``TRITON_INTERPRET=1`` in a child pytest and assert it passes (skipped where this process
    already interprets, running those cases itself, or where Triton is not installed). A child that hangs fails the
    test, naming the case it was in (``-v`` prints each case's name as it starts); a slow one does not."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the cases run in this process")
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    env = dict(os.environ, TRITON_INTERPRET="1")
    command = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", test_file]
    process = run_watched(command, f"the interpreter re-run of {test_file}", env=env, cwd=ROOT)
    assert process.returncode == 0, process.stdout[-8000:] + process.stderr[-4000:]


def reduce_xor_sums_with_numpy() -> None:
    """Have the interpreter compute ``tl.xor_sum`` with ``numpy.bitwise_xor.reduce``, as it computes ``tl.sum`` with
    ``numpy.sum``. It has no numpy form for it and falls back to a Python loop over the elements: 25 ms for the 1,024
    of one block of kept bits (``_forward_stats_kernel``'s pass 3), 28 % of the selection's cost at V = 2500. The
    value is the same: XOR is associative and commutative on integers, and the kernel's statement still runs."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    per_element = interpreter.ReduceOps.apply_impl

    def apply_impl(self, input):
        if self.combine_fn is tl.standard._xor_combine:
            (tensor,) = input
            data = np.bitwise_xor.reduce(tensor.handle.data, axis=self.axis, keepdims=self.keep_dims)
            return self.to_tensor(data, tensor.dtype)
        return per_element(self, input)

    interpreter.ReduceOps.apply_impl = apply_impl


def use_interpreter_tiles(ops) -> None:
    """Give ``_triton_ops`` module ``ops`` the interpreter's tiles of the selection's loops: the sample ranked in 8
    steps of 64 sampled entries instead of 64 steps of 8, a round's count in steps of 256 entries instead of 64. The
    interpreter pays per loop step (a GPU pays per register). Both only group the same comparisons differently: the
    counts, the selection's route and its result are the same; every loop still takes several steps, the last one
    partial, where a row is long enough (the windows and whole rows at V = 2500, the whole rows at V = 300)."""
    ops.SELECTION = dataclasses.replace(ops.SELECTION, rank_block=64, probe_block=256)
