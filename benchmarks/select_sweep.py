"""The Triton path's clamp selection under several sizes (``SelectionSizes`` of ``trl_entropy.kernels._triton_ops``),
side by side on one chunk of logits: the forward statistics kernel's time with the clamp against its time without,
and each size's thresholds against ``torch.kthvalue``'s (a size that gets one row wrong fails the run).

The chunk is ``--rows`` rows of ``hidden @ weight.T`` in fp32 from random bf16 inputs (``--hidden`` columns), what
the kernel reads in training. The sizes are the defaults and every point of ``--grid`` (a JSON object of field ->
list of values, their product, the other fields at their defaults); each is timed ``--repeats`` times, in turns with
the others, and the table gives the median per chunk and the selection's share (the time over the clamp-0 kernel's)
scaled to ``--scale-rows`` rows (the kernel benchmark's 16,384 tokens by default).

    python benchmarks/select_sweep.py --device cuda
    python benchmarks/select_sweep.py --device cuda --grid '{"probe_block": [32, 64, 128], "num_warps": [4, 8]}'
    python benchmarks/select_sweep.py --dry-run     # toy sizes on the CPU, under the Triton interpreter
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import time


DEFAULT_GRID = {"probe_block": [64, 128, 256], "probes": [16, 32], "sample": [512, 1024], "num_warps": [4, 8]}
DRY_RUN_GRID = {"probes": [16, 32]}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--rows", type=int, default=441, help="rows of the chunk (CUDA's default chunk at V 151,936)")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--clamp-fraction", type=float, default=0.3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scale-rows", type=int, default=16384)
    parser.add_argument("--grid", default=json.dumps(DEFAULT_GRID), help="JSON object: SelectionSizes field -> values")
    parser.add_argument(
        "--dry-run", action="store_true", help="4 rows of V = 3000 on the CPU under TRITON_INTERPRET=1, one repeat"
    )
    args = parser.parse_args(argv)
    if args.dry_run:
        args.device, args.rows, args.vocab, args.hidden, args.repeats = "cpu", 4, 3000, 16, 1
        if "--grid" not in (argv if argv is not None else sys.argv[1:]):
            args.grid = json.dumps(DRY_RUN_GRID)
    return args


def sizes_grid(defaults, grid_text: str) -> list:
    """The defaults, then every point of the grid (its fields checked against ``SelectionSizes``)."""
    try:
        grid = json.loads(grid_text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--grid is not JSON ({exc}): give an object such as '{json.dumps(DRY_RUN_GRID)}'") from None
    fields = {f.name for f in dataclasses.fields(defaults)}
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise SystemExit("--grid must be a JSON object of field -> non-empty list of values")
    unknown = sorted(set(grid) - fields)
    if unknown:
        raise SystemExit(f"--grid names {unknown}, not fields of SelectionSizes: {sorted(fields)}")
    points = [dataclasses.replace(defaults, **dict(zip(grid, values))) for values in itertools.product(*grid.values())]
    return [defaults] + [p for p in points if p != defaults]


def label(sizes, defaults) -> str:
    changed = [
        f"{f.name}={getattr(sizes, f.name)}"
        for f in dataclasses.fields(sizes)
        if getattr(sizes, f.name) != getattr(defaults, f.name)
    ]
    return ", ".join(changed) or "defaults"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are decorated, at their module's import
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    sys.path[:0] = [root, os.path.join(root, "tests")]
    import torch
    from _reference.select_reference import sort_keys, threshold_keys

    from trl_entropy.kernels import _triton_ops as ops

    device = torch.device(args.device)
    torch.manual_seed(0)
    hidden = torch.randn(args.rows, args.hidden, device=device, dtype=torch.bfloat16)
    weight = torch.randn(args.vocab, args.hidden, device=device, dtype=torch.bfloat16) * args.hidden**-0.5
    z = (hidden.float() @ weight.float().t()).contiguous()
    targets = torch.randint(0, args.vocab, (args.rows,), device=device)
    k = int(args.clamp_fraction * args.vocab)
    want = threshold_keys(z.cpu(), k)

    defaults = ops.SELECTION
    runs = [("clamp 0", defaults, 0)] + [(label(s, defaults), s, k) for s in sizes_grid(defaults, args.grid)]

    def call(sizes, k_run):
        ops.SELECTION = sizes
        work = torch.empty(args.rows * ops.scratch_per_row(args.vocab), device=device) if k_run else None
        if device.type == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = ops.forward_stats(z, targets, k_run, work)
            end.record()
            torch.cuda.synchronize()
            return out, start.elapsed_time(end)
        t0 = time.perf_counter()
        out = ops.forward_stats(z, targets, k_run, work)
        return out, (time.perf_counter() - t0) * 1e3

    wrong = []
    for name, sizes, k_run in runs:  # compile, and check the thresholds
        out, _ = call(sizes, k_run)
        if k_run and not torch.equal(sort_keys(out["thr"].cpu()), want):
            wrong.append(name)
    times = {name: [] for name, _, _ in runs}
    for _ in range(args.repeats):
        for name, sizes, k_run in runs:
            times[name].append(call(sizes, k_run)[1])
    ops.SELECTION = defaults

    print(
        f"device={args.device} rows={args.rows} V={args.vocab} d={args.hidden} k={k} repeats={args.repeats} "
        f"scale_rows={args.scale_rows}"
    )
    print("| sizes | ms per chunk (median) | selection ms per chunk | selection ms at scale_rows | thresholds |")
    print("|---|---|---|---|---|")
    floor = statistics.median(times["clamp 0"])
    for name, _, k_run in runs:
        ms = statistics.median(times[name])
        sel = ms - floor if k_run else 0.0
        check = "—" if not k_run else ("**wrong**" if name in wrong else "= kthvalue")
        print(f"| {name} | {ms:.3f} | {sel:.3f} | {sel * args.scale_rows / args.rows:.1f} | {check} |")
    if wrong:
        print(f"thresholds differ from kthvalue's with: {wrong}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
