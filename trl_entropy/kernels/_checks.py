"""Input checks of :func:`chunked_logprob_entropy`: every bad argument is refused by name before any work starts."""

from __future__ import annotations

import math

import torch


BACKENDS = ("auto", "torch", "triton")


def finite_float(value, name: str, expected: str) -> float:
    """``value`` as a finite float, or a ValueError naming ``name`` and what it must be."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be {expected}, got {value!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be {expected}, got {value}")
    return value


def check_options(clamp_fraction, temperature, backend, logit_scale, final_logit_softcapping, gather_parameters):
    """The scalar options, checked and converted: ``(clamp_fraction, temperature, logit_scale, softcap)``."""
    clamp_fraction = float(clamp_fraction)
    if not 0.0 <= clamp_fraction < 1.0:  # also rejects NaN
        raise ValueError(f"clamp_fraction must be in [0, 1), got {clamp_fraction}")
    temperature = float(temperature)
    if not (temperature > 0.0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    logit_scale = finite_float(logit_scale, "logit_scale", "a finite number (0 is allowed)")
    if final_logit_softcapping is not None:
        final_logit_softcapping = finite_float(final_logit_softcapping, "final_logit_softcapping", "None or > 0")
        if final_logit_softcapping <= 0.0:
            raise ValueError(f"final_logit_softcapping must be None or > 0, got {final_logit_softcapping}")
    if gather_parameters is not None and not callable(gather_parameters):
        raise ValueError(
            f"gather_parameters must be None or a callable (weight, bias) -> context, got {gather_parameters!r}"
        )
    return clamp_fraction, temperature, logit_scale, final_logit_softcapping


def check_tensors(hidden, weight, targets, bias) -> None:
    """Shapes, dtypes and devices of the tensors (``weight`` and ``bias`` whole, i.e. gathered when sharded)."""
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 2:
        raise ValueError(f"hidden must be a 2-D tensor (N, d), got shape {tuple(getattr(hidden, 'shape', ()))}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"weight must be a 2-D tensor (V, d), got shape {tuple(getattr(weight, 'shape', ()))}")
    n_tokens, d = hidden.shape
    vocab = weight.shape[0]
    if weight.shape[1] != d:
        raise ValueError(
            f"weight has hidden size {weight.shape[1]} but hidden has {d}: weight must be (V, d) = (V, {d}), "
            f"got {tuple(weight.shape)}"
        )
    if vocab < 1:
        raise ValueError("weight must have at least one row (V >= 1)")
    if not hidden.is_floating_point() or not weight.is_floating_point():
        raise ValueError(f"hidden and weight must be floating point, got {hidden.dtype} and {weight.dtype}")
    if not isinstance(targets, torch.Tensor) or tuple(targets.shape) != (n_tokens,):
        raise ValueError(f"targets must have shape (N,) = ({n_tokens},), got {tuple(getattr(targets, 'shape', ()))}")
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise ValueError(f"targets must be an integer tensor of token ids, got {targets.dtype}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (vocab,):
            raise ValueError(f"bias must have shape (V,) = ({vocab},), got {tuple(getattr(bias, 'shape', ()))}")
        if bias.device != hidden.device:
            raise ValueError(f"bias is on {bias.device} but hidden is on {hidden.device}")
    if weight.device != hidden.device or targets.device != hidden.device:
        raise ValueError(
            f"hidden, weight and targets must be on the same device, got {hidden.device}, {weight.device}, "
            f"{targets.device}"
        )


def check_chunk_size(chunk_size) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int (tokens per chunk), got {chunk_size!r}")


def check_target_ids(targets: torch.Tensor, vocab: int) -> None:
    """Every id in ``[0, V)`` (``targets`` already ``long``)."""
    outside = (targets < 0) | (targets >= vocab)
    if targets.numel() and bool(outside.any()):
        raise ValueError(f"target ids must be in [0, V) = [0, {vocab}), got {targets[outside][0].item()}")


def check_top_p(top_p, top_k, include_crossing, clamp_fraction: float, return_kept_count) -> tuple[float, int | None]:
    """The top-p options, checked: ``(top_p, top_k)`` as a float and an int (or None). ``clamp_fraction`` is the
    checked float; the clamp and top-p are two rules for the same output, so one of them must be off."""
    if not isinstance(include_crossing, bool):
        raise ValueError(f"include_crossing must be a bool, got {include_crossing!r}")
    if not isinstance(return_kept_count, bool):
        raise ValueError(f"return_kept_count must be a bool, got {return_kept_count!r}")
    if top_p is None:
        if top_k is not None:
            raise ValueError(f"top_k limits the top-p set: it needs top_p, got top_k={top_k!r} with top_p=None")
        if include_crossing:
            raise ValueError("include_crossing=True changes the top-p set: it needs top_p, got top_p=None")
        if return_kept_count:
            raise ValueError("return_kept_count=True returns the top-p set's size: it needs top_p, got top_p=None")
        return None, None
    if isinstance(top_p, bool):
        raise ValueError(f"top_p must be a number in (0, 1], got {top_p!r}")
    top_p = finite_float(top_p, "top_p", "a number in (0, 1]")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be a number in (0, 1], got {top_p}")
    if clamp_fraction != 0.0:
        raise ValueError(
            f"clamp_fraction and top_p are two rules for the third output: with top_p={top_p} set, clamp_fraction "
            f"must be 0, got {clamp_fraction}"
        )
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    return top_p, top_k
