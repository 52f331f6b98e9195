"""The clamp's threshold on the CPU: the PyTorch path's counting search (``trl_entropy.kernels._select``) against a
radix select written with PyTorch ops (AIR top-k's and RAFT select_k's design: a histogram of the keys' top 11 bits
per row, the k-th smallest entry's bucket compacted, then its low 21 bits), side by side in one process.

Both run by row blocks of ``--block-kib`` KiB of logits (the counting search's own default block is 512 KiB). Each
round times every method once, in an order that alternates between rounds; the table gives the median and the minimum
per method, in ns per logit. Both results are checked against ``torch.kthvalue``'s kept set before timing.

    python benchmarks/select_bench.py --shapes 512,32768 512,151936 --rounds 5 --threads 1
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import time

import torch

from trl_entropy.kernels._select import kth_smallest_threshold


def radix_threshold(z: torch.Tensor, k: int, block_rows: int) -> torch.Tensor:
    """Per row of ``z`` (n, V) fp32: the k-th smallest value, by a histogram of the keys' top 11 bits (one
    ``bincount`` per block of rows), then the sorted low bits of the chosen bucket's entries."""
    n, vocab = z.shape
    thr = torch.empty(n, dtype=torch.float32)
    for r0 in range(0, n, block_rows):
        zb = z[r0 : r0 + block_rows]
        rows = zb.shape[0]
        bits = zb.view(torch.int32)
        keys = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # integer order = float order
        top = keys >> 21
        top_id = top + (torch.arange(rows, dtype=torch.int32) * 2048 + 1024).unsqueeze(1)
        hist = torch.bincount(top_id.view(-1), minlength=rows * 2048).view(rows, 2048)
        cum = hist.cumsum(1)
        below = cum < k
        bucket = below.sum(1)
        rank = k - torch.where(below, cum, 0).amax(1)
        in_bucket = top == (bucket - 1024).unsqueeze(1).to(torch.int32)
        cand = keys[in_bucket].long()  # row-major: grouped by row
        counts = in_bucket.sum(1)
        owner = torch.repeat_interleave(torch.arange(rows), counts)
        # each row's candidates ascending: their keys offset by row, sorted once
        ordered = (cand + (owner << 32)).sort().values - (owner << 32)
        start = torch.cumsum(counts, 0) - counts
        kth = ordered[start + rank - 1].to(torch.int32)
        thr[r0 : r0 + rows] = (kth ^ ((kth >> 31) & 0x7FFFFFFF)).view(torch.float32)
    return thr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["512,32768", "512,151936"], help="N,V pairs")
    parser.add_argument("--clamp-fraction", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--block-kib", type=int, default=512)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), clamp {args.clamp_fraction}, {args.rounds} rounds")
    print("| N, V | method | ns per logit, median | min |")
    print("|---|---|---|---|")
    for shape in args.shapes:
        n, vocab = (int(x) for x in shape.split(","))
        k = math.floor(args.clamp_fraction * vocab)
        z = torch.randn(n, vocab, generator=torch.Generator().manual_seed(0)) * 3
        block_rows = max(1, (args.block_kib << 10) // (4 * vocab))
        methods = {
            "counting search (_select.py)": functools.partial(kth_smallest_threshold, z, k),
            "radix select (torch ops)": functools.partial(radix_threshold, z, k, block_rows),
        }
        kth = torch.kthvalue(z, k, dim=1).values
        for name, run in methods.items():
            assert torch.equal(z <= run()[:, None], z <= kth[:, None]), name
        times = {name: [] for name in methods}
        for r in range(args.rounds):
            for name in list(methods)[:: 1 if r % 2 == 0 else -1]:
                t0 = time.perf_counter()
                methods[name]()
                times[name].append((time.perf_counter() - t0) * 1e9 / z.numel())
        for name, ts in times.items():
            print(f"| {n}, {vocab} | {name} | {statistics.median(ts):.2f} | {min(ts):.2f} |")


if __name__ == "__main__":
    main()
