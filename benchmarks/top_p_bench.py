"""SIREN's top-p entropy against the clamp in the fused kernel on the CPU: forward + backward, side by side in one
process.

Methods: ``clamp 0`` (log-prob and entropy only), ``clamp 0.3`` (the clamped entropy), ``top-p`` (``top_p=--top-p``,
``top_k`` None) and ``top-p, top_k`` (``--top-k``, the authors' 15,000 by default), all with ``backend="torch"``. The
logits are Gaussian with standard deviation ``--logit-std`` (``hidden @ weight.T`` with ``weight`` scaled to it): the
larger it is, the more peaked the rows and the smaller the top-p sets. Each round times every method once, in an order
that rotates between rounds; the table gives the median and the minimum wall and CPU times per method, the CPU time's
ratio to the clamp's, and the mean top-p set size.

    python benchmarks/top_p_bench.py --shape 512,256,32768 --logit-std 2 6 --rounds 5 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from trl_entropy.kernels import chunked_logprob_entropy


def methods(top_p: float, top_k: int) -> dict[str, dict]:
    return {
        "clamp 0": {},
        "clamp 0.3": {"clamp_fraction": 0.3},
        f"top-p {top_p}": {"top_p": top_p, "return_kept_count": True},
        f"top-p {top_p}, top_k {top_k}": {"top_p": top_p, "top_k": top_k, "return_kept_count": True},
    }


def step(hidden, weight, targets, kwargs) -> float:
    """One forward + backward (loss: the sum of the three differentiable outputs); the mean set size, or NaN."""
    outputs = chunked_logprob_entropy(hidden, weight, targets, backend="torch", **kwargs)
    sum(o.sum() for o in outputs[:3]).backward()
    return outputs[3].mean().item() if len(outputs) == 4 else float("nan")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="512,256,32768", help="N,d,V")
    parser.add_argument("--logit-std", type=float, nargs="+", default=[2.0, 6.0])
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--top-k", type=int, default=15000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    n, d, vocab = (int(x) for x in args.shape.split(","))
    print(f"N={n} d={d} V={vocab}, threads={torch.get_num_threads()}, torch {torch.__version__}, {args.rounds} rounds")
    print("| logit std | method | wall ms (median / min) | CPU ms (median / min) | CPU vs clamp 0.3 | mean set size |")
    print("|---|---|---|---|---|---|")
    for std in args.logit_std:
        g = torch.Generator().manual_seed(0)
        hidden = torch.randn(n, d, generator=g).requires_grad_()
        weight = (torch.randn(vocab, d, generator=g) * (std / d**0.5)).requires_grad_()
        targets = torch.randint(0, vocab, (n,), generator=g)
        table = methods(args.top_p, args.top_k)
        names = list(table)
        for name in names:  # warm-up
            step(hidden, weight, targets, table[name])
        wall = {name: [] for name in names}
        cpu = {name: [] for name in names}
        size = {}
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                hidden.grad = weight.grad = None
                w0, c0 = time.perf_counter(), time.process_time()
                size[name] = step(hidden, weight, targets, table[name])
                wall[name].append(1e3 * (time.perf_counter() - w0))
                cpu[name].append(1e3 * (time.process_time() - c0))
        base = statistics.median(cpu["clamp 0.3"])
        for name in names:
            print(
                f"| {std:g} | {name} | {statistics.median(wall[name]):.0f} / {min(wall[name]):.0f} "
                f"| {statistics.median(cpu[name]):.0f} / {min(cpu[name]):.0f} "
                f"| {statistics.median(cpu[name]) / base:.2f} | {size[name]:.1f} |"
            )


if __name__ == "__main__":
    main()
