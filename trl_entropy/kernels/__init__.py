"""Fused chunked log-prob / entropy / clamped-entropy kernels (``trl_entropy.kernels``)."""

from .logprob_entropy import (
    ChunkedLogProbEntropyFunction,
    chunked_logprob_entropy,
    default_chunk_size,
    triton_available,
)


__all__ = [
    "ChunkedLogProbEntropyFunction",
    "chunked_logprob_entropy",
    "default_chunk_size",
    "triton_available",
]
