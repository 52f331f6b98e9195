"""The fused kernel against its float64 and CPU references (`_reference/`). Tiers (`_support/tiers.py`): training
unless named below."""

import pytest
from _support.tiers import mark_tier

import trl_entropy.kernels.logprob_entropy as lpe


FILES = {
    "test_kernel.py": "pure",
    "test_kernel_cuda.py": "pure",
    "test_kernel_select.py": "pure",
    "test_kernel_triton.py": "pure",
    "test_kernel_triton_select.py": "pure",
    "test_kernel_top_p.py": "pure",
}
LAUNCHES = {
    "test_kernel_triton.py": {"test_triton_interpreter_matches_float64"},
    "test_kernel_triton_select.py": {"test_selection_under_the_interpreter"},
    "test_kernel_top_p.py": {"test_top_p_under_the_interpreter"},
}
TESTS = {"test_kernel_top_p.py": {"test_head_scores_top_p_entropy_and_set_size": "loss_step"}}


def pytest_itemcollected(item):
    mark_tier(item, "training", FILES, LAUNCHES, TESTS)


@pytest.fixture
def logit_shapes(monkeypatch):
    """(rows, vocabulary entries) of every block of logits the kernel computes, in order."""
    shapes = []
    chunk_logits = lpe._chunk_logits

    def recorded(h, w, *args):
        shapes.append((h.shape[0], w.shape[0]))
        return chunk_logits(h, w, *args)

    monkeypatch.setattr(lpe, "_chunk_logits", recorded)
    return shapes
