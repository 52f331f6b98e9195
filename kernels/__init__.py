"""Fused chunked log-prob / entropy / clamped-entropy kernels (``trl_entropy.kernels``)."""

from .logprob_entropy import (
    ChunkedLogProbEntropyFunction,
    chunked_logprob_entropy,
    default_chunk_size,
    triton_available,
)
from .naive import naive_logprob_entropy


__all__ = [
    "ChunkedLogProbEntropyFunction",
    "chunked_logprob_entropy",
    "default_chunk_size",
    "naive_logprob_entropy",
    "triton_available",
]
