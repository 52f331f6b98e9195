"""Fused chunked log-prob / entropy / clamped-entropy kernels."""
