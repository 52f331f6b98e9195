"""SIREN's top-p entropy in the fused kernel (``top_p=``): values, gradients and set sizes against a float64
full-logit reference of the same prefix rule, on both backends.

The Triton cases need ``TRITON_INTERPRET=1`` when the kernels are decorated: ``test_top_p_under_the_interpreter``
runs this file's ``interpreted`` tests in a pytest subprocess with it set (they run in this process under
``TRITON_INTERPRET=1``).
"""

import functools
import math
import os
from pathlib import Path

import pytest
import torch
from _reference.float64_reference import float64_logits, kernel_inputs
from _support.interpreter import rerun_under_the_interpreter

from trl_entropy.kernels import _top_p, chunked_logprob_entropy


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
ROOT = Path(__file__).resolve().parents[2]
interpreted = pytest.mark.skipif(
    not INTERPRETED, reason="needs TRITON_INTERPRET=1 (test_top_p_under_the_interpreter sets it)"
)
torch_only = pytest.mark.skipif(INTERPRETED, reason="the PyTorch path's cases run in the parent pytest process")
N, D, V = 23, 16, 301


# ---------------------------------------------------------------------------------------------------------------------
# The float64 reference of the prefix rule
# ---------------------------------------------------------------------------------------------------------------------
def top_p_reference(z, top_p, top_k=None, include_crossing=False):
    """``(H^p, |S|, margin)`` per row of float64 logits ``z``: the ranks ``j <= K'`` with ``C_j < p`` (and the
    crossing rank with ``include_crossing``), the entropy of the softmax renormalised over them (0 for an empty set),
    differentiable with the set fixed. ``C_j >= p`` is tested as ``1 - C_j <= 1 - p`` with ``1 - C_j`` summed over
    the lower ranks (exactly 0 at the last rank, so ``p = 1`` crosses there and only there). ``margin``: the smallest
    ``|C_j - p|`` (the rows are far from the boundary when it is well above fp32's rounding)."""
    n, vocab = z.shape
    top_k = vocab if top_k is None else min(top_k, vocab)
    order = z.detach().argsort(-1, descending=True)
    mass = torch.softmax(z.detach(), -1).gather(-1, order)
    below_mass = mass.flip(-1).cumsum(-1).flip(-1) - mass  # 1 - C_j
    below_p = (below_mass > 1 - top_p).sum(-1)  # ranks with C_j < p (a prefix: 1 - C_j decreases)
    crossing = below_p + 1
    size = torch.clamp(crossing if include_crossing else below_p, max=top_k)
    ranks = torch.arange(vocab).expand(n, vocab)
    kept = torch.zeros(n, vocab, dtype=torch.bool).scatter_(1, order, ranks < size[:, None])
    empty = size == 0
    top = torch.zeros(n, vocab, dtype=torch.bool).scatter_(1, order[:, :1], True)
    kept_safe = kept | (empty[:, None] & top)  # a finite stand-in for empty rows, whose value and gradient are 0
    z_kept = z.masked_fill(~kept_safe, -math.inf)
    entropy = torch.logsumexp(z_kept, -1) - (torch.softmax(z_kept, -1) * z.masked_fill(~kept_safe, 0.0)).sum(-1)
    entropy = torch.where(empty, torch.zeros_like(entropy), entropy)
    margin = (mass.cumsum(-1) - top_p).abs().min().item() if top_p < 1 else math.inf
    return entropy, size.to(torch.float64), margin


# Random tie-free rows: ``z`` has a spread of ~3 * ``scale`` (peaked rows at 1, flat ones at 0.1).
make_inputs = functools.partial(kernel_inputs, n=N, d=D, vocab=V)


def close(actual, expected, what, rtol=1e-5):
    err = (actual.double() - expected.double()).abs().max().item()
    scale = max(expected.abs().max().item(), 1e-30)
    assert err <= rtol * scale, f"{what}: max abs error {err:.3e} > {rtol} * {scale:.3e}"


def check_against_reference(inputs, backend, *, top_p, top_k=None, include_crossing=False, logit_map=None, **kw):
    """Values, set sizes and the gradients of hidden, weight and bias (H^p alone, then every output) against the
    float64 reference. Returns the reference's set sizes."""
    hidden, weight, bias, targets = inputs
    logit_map = logit_map or {}
    leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    log_probs, entropy, h_p, size = chunked_logprob_entropy(
        leaves[0],
        leaves[1],
        targets,
        bias=leaves[2],
        top_p=top_p,
        top_k=top_k,
        include_crossing=include_crossing,
        return_kept_count=True,
        backend=backend,
        **logit_map,
        **kw,
    )
    ref_leaves = [t.double().requires_grad_() for t in (hidden, weight, bias)]
    z = float64_logits(*ref_leaves, **logit_map)
    ref_h, ref_size, margin = top_p_reference(z, top_p, top_k, include_crossing)
    assert margin > 1e-6, f"a row's cumulative mass is within {margin:.1e} of p: pick another seed"
    log_z = torch.logsumexp(z, -1)
    ref_lp = z.gather(-1, targets[:, None]).squeeze(-1) - log_z
    ref_entropy = log_z - (torch.softmax(z, -1) * z).sum(-1)

    assert size.dtype == torch.float32 and not size.requires_grad
    assert torch.equal(size.double(), ref_size), f"set sizes {size.tolist()} != {ref_size.tolist()}"
    for name, a, b in (("log_probs", log_probs, ref_lp), ("entropy", entropy, ref_entropy), ("H^p", h_p, ref_h)):
        close(a, b, name)
    g = torch.Generator().manual_seed(1)
    w = [torch.randn(hidden.shape[0], generator=g, dtype=torch.float64) for _ in range(3)]
    for used in ((2,), (0, 1, 2)):
        outs, refs = (log_probs, entropy, h_p), (ref_lp, ref_entropy, ref_h)
        grads = torch.autograd.grad([outs[i] for i in used], leaves, [w[i].float() for i in used], retain_graph=True)
        ref_grads = torch.autograd.grad([refs[i] for i in used], ref_leaves, [w[i] for i in used], retain_graph=True)
        for name, a, b in zip(("hidden", "weight", "bias"), grads, ref_grads):
            close(a, b, f"grad {name}, outputs {used} in the loss")
    return ref_size


# (top_p, top_k, include_crossing, scale): mixed sizes; empty sets (a large first probability); top_k below the
# crossing rank; top_k >= V; p = 1; flat rows whose sets are wider than the first top-k
CASES = [
    (0.9, None, False, 1.0),
    (0.9, None, True, 1.0),
    (0.3, None, False, 1.0),
    (0.99, 3, False, 1.0),
    (0.99, 3, True, 1.0),
    (0.9, 1000, False, 1.0),
    (1.0, None, False, 1.0),
    (1.0, None, True, 1.0),
    (1.0, 40, False, 1.0),
    (0.9, None, False, 0.1),
    (0.9, 200, True, 0.1),
]


def assert_case_covered(sizes, top_p, top_k, include_crossing, scale):
    """What the case is for is in the data: mixed sizes, empty sets, the top-k cap, p = 1's V - 1 entries."""
    vocab = V
    if top_p == 0.3 and not include_crossing:
        assert (sizes == 0).any() and (sizes > 1).any(), sizes
    elif top_k is not None and top_k < vocab:
        assert (sizes == top_k).any(), sizes
    elif top_p == 1.0:
        assert (sizes == (vocab if include_crossing else vocab - 1)).all(), sizes
    else:
        assert sizes.unique().numel() > 3, sizes
    if scale < 1:
        assert (sizes > _top_p.FIRST_WIDTH).any(), sizes


# ---------------------------------------------------------------------------------------------------------------------
# PyTorch path
# ---------------------------------------------------------------------------------------------------------------------
WORKED_Z = [[2.0, 1.5, 1.0, 0.0, -1.0]]


def check_worked_example(backend):
    """The brief's example: V = 5, p = 0.8. S = the first two tokens (the third crosses p)."""
    z = torch.tensor(WORKED_Z, requires_grad=True)
    for include, value, size, grad in (
        (False, 0.6628, 2, [-0.1175, 0.1175, 0.0, 0.0, 0.0]),
        (True, 1.0202, 3, None),
    ):
        out = chunked_logprob_entropy(
            z,
            torch.eye(5),
            torch.tensor([0]),
            top_p=0.8,
            include_crossing=include,
            return_kept_count=True,
            backend=backend,
        )
        assert abs(out[2].item() - value) < 5e-5 and out[3].item() == size, (include, out)
        (g,) = torch.autograd.grad(out[2].sum(), z)
        if grad is not None:
            torch.testing.assert_close(g, torch.tensor([grad]), atol=5e-5, rtol=0)
            assert (g[0, 2:] == 0).all()
    # the intermediate numbers: pi, C, pi~
    pi = torch.softmax(torch.tensor(WORKED_Z[0], dtype=torch.float64), 0)
    torch.testing.assert_close(
        pi, torch.tensor([0.4631, 0.2809, 0.1704, 0.0627, 0.0231], dtype=torch.float64), atol=5e-5, rtol=0
    )
    torch.testing.assert_close(
        pi[:2] / pi[:2].sum(), torch.tensor([0.6225, 0.3775], dtype=torch.float64), atol=5e-5, rtol=0
    )


@torch_only
def test_worked_example():
    check_worked_example("torch")


@torch_only
@pytest.mark.parametrize("top_p,top_k,include_crossing,scale", CASES)
@pytest.mark.parametrize("chunk_size", [5, None])
def test_matches_float64_prefix_rule(top_p, top_k, include_crossing, scale, chunk_size):
    sizes = check_against_reference(
        make_inputs(scale=scale),
        "torch",
        top_p=top_p,
        top_k=top_k,
        include_crossing=include_crossing,
        chunk_size=chunk_size,
    )
    assert_case_covered(sizes, top_p, top_k, include_crossing, scale)


@torch_only
@pytest.mark.parametrize(
    "logit_map",
    [
        {"temperature": 0.7},
        {"temperature": 1.3, "logit_scale": 0.25},
        {"final_logit_softcapping": 2.0, "logit_scale": 1 / 8, "temperature": 0.7},
    ],
)
def test_matches_float64_with_the_logit_map(logit_map):
    check_against_reference(make_inputs(seed=2), "torch", top_p=0.8, logit_map=logit_map, chunk_size=7)


@torch_only
@pytest.mark.parametrize("first_width", [1, 4])
def test_widening_top_k_by_row_blocks(first_width, monkeypatch):
    """Rows whose set is wider than the first top-k take wider ones, by blocks of rows: every round agrees."""
    monkeypatch.setattr(_top_p, "FIRST_WIDTH", first_width)
    for top_p, top_k, include_crossing in ((0.9, None, False), (0.5, 30, True), (0.3, None, False)):
        check_against_reference(
            make_inputs(scale=0.5), "torch", top_p=top_p, top_k=top_k, include_crossing=include_crossing, chunk_size=9
        )


@torch_only
def test_empty_set_has_zero_value_and_zero_gradient():
    """Rows whose first probability is >= p: H^p = 0 and not one gradient entry, whatever the other rows do."""
    z = torch.randn(6, 50, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    z[:3, 7] += 12.0  # pi_max > 0.99 in the first three rows
    h = z.float().requires_grad_()
    _, _, h_p, size = chunked_logprob_entropy(
        h, torch.eye(50), torch.zeros(6, dtype=torch.long), top_p=0.9, return_kept_count=True, backend="torch"
    )
    (h_p * torch.arange(1.0, 7.0)).sum().backward()
    assert (size[:3] == 0).all() and (size[3:] > 1).all(), size
    assert (h_p[:3] == 0).all() and torch.isfinite(h_p).all()
    assert (h.grad[:3] == 0).all() and torch.isfinite(h.grad).all() and (h.grad[3:] != 0).any()


@torch_only
def test_outputs_without_the_set_size_and_the_default_clamp_path():
    hidden, weight, bias, targets = make_inputs()
    three = chunked_logprob_entropy(hidden, weight, targets, bias=bias, top_p=0.9, backend="torch")
    four = chunked_logprob_entropy(hidden, weight, targets, bias=bias, top_p=0.9, return_kept_count=True)
    assert len(three) == 3 and len(four) == 4
    for a, b in zip(three, four):
        assert torch.equal(a, b)
    assert len(chunked_logprob_entropy(hidden, weight, targets, clamp_fraction=0.3)) == 3


@torch_only
@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"top_p": 0.0}, "top_p must be a number in (0, 1]"),
        ({"top_p": 1.5}, "top_p must be a number in (0, 1]"),
        ({"top_p": float("nan")}, "top_p must be"),
        ({"top_p": "high"}, "top_p must be"),
        ({"top_p": True}, "top_p must be"),
        ({"top_p": 0.9, "top_k": 0}, "top_k must be None or an int >= 1"),
        ({"top_p": 0.9, "top_k": 2.5}, "top_k must be None or an int >= 1"),
        ({"top_p": 0.9, "top_k": True}, "top_k must be None or an int >= 1"),
        ({"top_p": 0.9, "clamp_fraction": 0.3}, "clamp_fraction and top_p"),
        ({"top_k": 5}, "top_k limits the top-p set: it needs top_p"),
        ({"include_crossing": True}, "include_crossing=True changes the top-p set: it needs top_p"),
        ({"top_p": 0.9, "include_crossing": 1}, "include_crossing must be a bool"),
        ({"return_kept_count": True}, "return_kept_count=True returns the top-p set's size: it needs top_p"),
    ],
)
def test_bad_top_p_arguments_are_refused_by_name(kwargs, message):
    hidden, weight, _, targets = make_inputs(n=3)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        chunked_logprob_entropy(hidden, weight, targets, **kwargs)


@torch_only
def test_head_scores_top_p_entropy_and_set_size():
    """``score_completions`` with ``top_p``: (B, T) entropy (differentiable) and set size (float, no gradient), zero at
    masked positions, against the reference on the model's own logits; None without ``top_p``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from trl_entropy.core.head import EntropyHeadRequest, install_entropy_head, score_completions

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=61,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)  # peaked rows: sets of a few tokens, some empty
    input_ids = torch.randint(0, 61, (3, 9))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, -2:] = 0
    keep = 5
    with torch.no_grad():
        z = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -keep - 1 : -1].double()
    install_entropy_head(model, temperature=1.0)
    request = EntropyHeadRequest(logits_to_keep=keep, top_p=0.7, backend="torch")
    scored = score_completions(model, input_ids, attention_mask, request, batch_size=2)
    mask = attention_mask[:, -keep:].bool()
    ref_h, ref_size, _ = top_p_reference(z[mask], 0.7)
    assert scored.top_p_entropy.shape == (3, keep) and scored.top_p_entropy.requires_grad
    assert scored.top_p_set_size.dtype == torch.float32 and not scored.top_p_set_size.requires_grad
    assert scored.clamped_entropy is None
    torch.testing.assert_close(scored.top_p_entropy[mask].double(), ref_h, rtol=1e-4, atol=1e-5)
    assert torch.equal(scored.top_p_set_size[mask].double(), ref_size)
    assert (scored.top_p_set_size[~mask] == 0).all() and (scored.top_p_entropy[~mask] == 0).all()
    assert (ref_size == 0).any() and (ref_size > 1).any(), ref_size
    plain = score_completions(model, input_ids, attention_mask, EntropyHeadRequest(logits_to_keep=keep))
    assert plain.top_p_entropy is None and plain.top_p_set_size is None


# ---------------------------------------------------------------------------------------------------------------------
# Triton path, under the interpreter
# ---------------------------------------------------------------------------------------------------------------------
def test_top_p_under_the_interpreter():
    rerun_under_the_interpreter(__file__)


@interpreted
def test_triton_worked_example():
    check_worked_example("triton")


@interpreted
@pytest.mark.parametrize(
    "top_p,top_k,include_crossing,scale",
    [(0.9, None, False, 1.0), (0.3, None, False, 1.0), (0.99, 3, True, 1.0), (1.0, None, False, 1.0)],
)
def test_triton_matches_float64_prefix_rule(top_p, top_k, include_crossing, scale):
    inputs = make_inputs(n=8, vocab=V, scale=scale)
    check_against_reference(
        inputs,
        "triton",
        top_p=top_p,
        top_k=top_k,
        include_crossing=include_crossing,
        chunk_size=5,
        logit_map={"temperature": 0.7} if top_p == 0.9 else None,
    )


@interpreted
def test_triton_equals_torch():
    hidden, weight, bias, targets = make_inputs(n=8)
    kwargs = dict(bias=bias, top_p=0.8, return_kept_count=True)
    a = chunked_logprob_entropy(hidden, weight, targets, backend="triton", **kwargs)
    b = chunked_logprob_entropy(hidden, weight, targets, backend="torch", **kwargs)
    for x, y in zip(a, b):
        close(x, y, "triton vs torch")
