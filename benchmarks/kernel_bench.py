"""Benchmark of the fused log-prob / entropy / clamped-entropy head: time (forward + backward) and peak memory.

Methods
-------
naive          full fp32 logits; log_softmax, entropy, and the clamped entropy from ``torch.topk`` of the kept entries
               (``naive_logprob_entropy`` of ``tests/_reference/kernel_reference.py``), backward through autograd.
reference      the AEnt authors' recipe: full fp32 logits, moved to the CPU for ``torch.topk`` (indices of the kept
               entries), back on the device for a gather and the clamped entropy; log-prob and entropy as ``naive``.
               (On a CPU run the move is a no-op.)
trl            TRL's fused head ``trl.kernels.ChunkedLogProbFunction`` (log-prob + full entropy; no clamp), with
               TRL's own vocabulary chunk (32768) and token tile (4096).
liger          Liger's chunked GRPO loss ``liger_kernel.chunked_loss.LigerFusedLinearGRPOLoss`` (log-probs inside a
               GRPO loss, no entropy; ``compiled`` on CUDA only), tokens as sequences of up to 1024.
gemm_floor     the four LM-head GEMMs alone, chunk by chunk like ``ours`` (logits, their recompute, the gradients
               of the hidden states and of the weight): the floor any recomputing chunked head pays.
ours           ``chunked_logprob_entropy(..., backend="torch")`` with the clamp.
ours_noclamp   the same with ``clamp_fraction=0`` (the work TRL's head does: like for like).
ours_triton    ``backend="triton"`` (CUDA only).
ours_cuda_path_emulated
               CPU only: ``ours`` with bf16 inputs on the CUDA bf16 path (GEMMs with bf16 operands and fp32 output,
               written into the chunk buffer and accumulated into the gradients in place), the GEMMs emulated by
               ``emulate_fp32_output_gemm`` of ``tests/_reference/cpu_emulation.py``. Its times measure the emulation;
               its peak memory is that path's (see below).

Each (shape, method) runs in a fresh subprocess. Peak memory is measured as

* CPU: the process's peak resident set size (``resource.getrusage().ru_maxrss``) during the first forward + backward,
  minus the resident size just before it (inputs already allocated). PyTorch's CPU allocator hands large blocks back
  to the OS when they are freed, so this is the high-water mark of what the method held at once, gradient buffers
  included. (``tracemalloc`` does not see torch's allocations.)
* CUDA: ``torch.cuda.max_memory_allocated()`` minus the allocation before the call.
* ``ours_cuda_path_emulated``: the peak of the bytes of tensors allocated by ATen ops during the first forward +
  backward and still alive (``TensorAllocations``, a dispatch mode; like ``max_memory_allocated``, inputs excluded,
  gradient buffers included), without the emulation's own fp32 copies of the GEMM operands (the CUDA GEMM reads
  bf16 directly).

The time is the median (and min) of ``--repeats`` forward + backward calls after that first one.

Examples::

    python benchmarks/kernel_bench.py                                   # CPU: N=4096, d=512, V=32768 and 151936
    python benchmarks/kernel_bench.py --shapes 4096,512,32768 --methods ours,trl --repeats 5
    python benchmarks/kernel_bench.py --device cuda                     # N=16384, d=3584, V=151936, bf16
    python benchmarks/kernel_bench.py --shapes 1024,512,151936 --methods ours_cuda_path_emulated --repeats 0
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time


CPU_SHAPES = ["4096,512,32768", "4096,512,151936"]
CUDA_SHAPES = ["16384,3584,151936"]
METHODS = [
    "naive",
    "reference",
    "trl",
    "liger",
    "gemm_floor",
    "ours",
    "ours_noclamp",
    "ours_triton",
    "ours_triton_noclamp",
    "ours_cuda_path_emulated",
]
CUDA_ONLY, CPU_ONLY = {"ours_triton", "ours_triton_noclamp"}, {"ours_cuda_path_emulated"}
DESCRIPTIONS = {
    "naive": "naive full logits (+topk clamp)",
    "reference": "AEnt reference (full logits, topk on CPU)",
    "trl": "TRL fused head (no clamp)",
    "liger": "Liger chunked GRPO loss (log-probs only)",
    "gemm_floor": "the four LM-head GEMMs alone (floor)",
    "ours": "ours, torch path",
    "ours_noclamp": "ours, torch path, clamp 0",
    "ours_triton": "ours, triton path",
    "ours_triton_noclamp": "ours, triton path, clamp 0",
    "ours_cuda_path_emulated": "ours, CUDA bf16 path emulated on CPU (peak: tracked tensors)",
}


# ---------------------------------------------------------------------------------------------------------------------
# Worker (one method, one shape, fresh process)
# ---------------------------------------------------------------------------------------------------------------------
def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reference_method(hidden, weight, targets, temperature, clamp_fraction):
    """The AEnt recipe: full fp32 logits, CPU topk for the kept indices, clamped entropy back on the device."""
    import torch

    logits = (hidden @ weight.t()).float()
    if temperature != 1.0:
        logits = logits / temperature
    log_p = torch.log_softmax(logits, dim=-1)
    log_probs = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    vocab = logits.shape[-1]
    keep = vocab - int(math.floor(clamp_fraction * vocab))
    with torch.no_grad():
        kept_idx = torch.topk(logits.detach().cpu(), keep, dim=-1).indices.to(logits.device)
    kept = logits.gather(-1, kept_idx)
    log_pk = torch.log_softmax(kept, dim=-1)
    clamped = -(log_pk.exp() * log_pk).sum(-1)
    return log_probs, entropy, clamped


def _default_chunk_size(n, vocab, device):
    from trl_entropy.kernels import default_chunk_size

    return default_chunk_size(n, vocab, device)


def _gemm_floor_function():
    import torch

    class GemmFloor(torch.autograd.Function):
        """Forward: the chunk's logits GEMM; backward: its recompute and the two gradient GEMMs (no element-wise work:
        the recomputed logits stand in for the logits gradient)."""

        @staticmethod
        def forward(ctx, hidden, weight, chunk):
            ctx.save_for_backward(hidden, weight)
            ctx.chunk = chunk
            buf = torch.empty(min(chunk, hidden.shape[0]), weight.shape[0], device=hidden.device, dtype=hidden.dtype)
            for r0 in range(0, hidden.shape[0], chunk):
                h = hidden[r0 : r0 + chunk]
                torch.mm(h, weight.t(), out=buf[: h.shape[0]])
            return hidden.new_zeros(())

        @staticmethod
        def backward(ctx, grad):
            hidden, weight = ctx.saved_tensors
            grad_h, grad_w = torch.zeros_like(hidden), torch.zeros_like(weight)
            buf = torch.empty(
                min(ctx.chunk, hidden.shape[0]), weight.shape[0], device=hidden.device, dtype=hidden.dtype
            )
            for r0 in range(0, hidden.shape[0], ctx.chunk):
                h = hidden[r0 : r0 + ctx.chunk]
                g = torch.mm(h, weight.t(), out=buf[: h.shape[0]])
                grad_h[r0 : r0 + ctx.chunk].addmm_(g, weight)
                grad_w.addmm_(g.t(), h)
            return grad_h, grad_w, None

    return GemmFloor


class _LazyGemmFloor:
    def apply(self, *args):
        return _gemm_floor_function().apply(*args)


_GemmFloor = _LazyGemmFloor()


def worker(args) -> None:
    import torch
    import trl.trainer.utils  # noqa: F401  (TRL's head and ours import it on first use: keep that out of the timing)

    n, d, vocab = (int(x) for x in args.shape.split(","))
    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    torch.manual_seed(0)
    hidden = torch.randn(n, d, device=device, dtype=dtype).requires_grad_()
    weight = (torch.randn(vocab, d, device=device, dtype=dtype) * (2.0 / math.sqrt(d))).requires_grad_()
    targets = torch.randint(0, vocab, (n,), device=device)
    temperature, clamp = args.temperature, args.clamp_fraction

    emulation = contextlib.nullcontext
    if args.method.startswith("ours") or args.method == "naive":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
        from _reference.cpu_emulation import TensorAllocations, emulate_fp32_output_gemm
        from _reference.kernel_reference import naive_logprob_entropy

        from trl_entropy.kernels import chunked_logprob_entropy

        if args.method == "ours_cuda_path_emulated":
            allocations = TensorAllocations()

            @contextlib.contextmanager
            def emulation():
                with emulate_fp32_output_gemm(allocations) as calls, allocations:
                    yield
                assert calls, "the fp32-output GEMM path was not taken"

    if args.method == "naive":

        def run():
            return naive_logprob_entropy(hidden, weight, targets, temperature=temperature, clamp_fraction=clamp)

    elif args.method == "reference":

        def run():
            return _reference_method(hidden, weight, targets, temperature, clamp)

    elif args.method == "trl":
        from trl.kernels import ChunkedLogProbFunction

        def run():
            out = ChunkedLogProbFunction.apply(
                hidden, weight, None, targets, temperature, 32768, None, 1.0, ("log_probs", "entropy")
            )
            return out[0], out[1]

    elif args.method == "liger":
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

        seq = min(n, 1024)
        rows = n // seq  # the benchmark's N is a multiple of its sequence length, or smaller than it
        loss_fn = LigerFusedLinearGRPOLoss(beta=0.0, use_ref_model=False, compiled=device.type == "cuda")
        mask = torch.ones(rows, seq, device=device, dtype=torch.long)
        advantages = torch.randn(rows, device=device)

        def run():
            loss = loss_fn(
                hidden[: rows * seq].view(rows, seq, d),
                weight,
                targets[: rows * seq].view(rows, seq),
                mask,
                advantages,
            )
            return (loss[0] if isinstance(loss, tuple) else loss).unsqueeze(0)

    elif args.method == "gemm_floor":
        chunk = args.chunk_size or _default_chunk_size(n, vocab, device)

        def run():
            return (_GemmFloor.apply(hidden, weight, chunk),)

    else:
        backend = "triton" if args.method.startswith("ours_triton") else "torch"
        fraction = 0.0 if args.method.endswith("noclamp") else clamp

        def run():
            return chunked_logprob_entropy(
                hidden,
                weight,
                targets,
                temperature=temperature,
                clamp_fraction=fraction,
                chunk_size=args.chunk_size,
                backend=backend,
            )

    def step():
        hidden.grad = None
        weight.grad = None
        with emulation():
            outputs = run()
            loss = sum(o.sum() for o in outputs)
            loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()

    cpu_times = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        start = time.perf_counter()
        step()
        first = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated() - base
    else:
        base = _rss_bytes()
        start = time.perf_counter()
        cpu_start = time.process_time()
        step()
        first = time.perf_counter() - start
        cpu_times.append(time.process_time() - cpu_start)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
        if args.method == "ours_cuda_path_emulated":
            peak = allocations.peak
    times = [first] if args.repeats == 0 else []
    if args.repeats:
        cpu_times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        cpu_start = time.process_time()
        step()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    profile = _profile(step, device, args.profile) if args.profile else []
    result = {
        "profile": profile,
        "times_ms": [t * 1e3 for t in times],
        "cpu_ms": [t * 1e3 for t in cpu_times],
        "first_ms": first * 1e3,
        "peak_mib": peak / 2**20,
        "threads": torch.get_num_threads(),
    }
    print("RESULT " + json.dumps(result))


def _profile(step, device, top):
    """One more forward + backward under ``torch.profiler``: the ``top`` operators and kernels by their own device
    time (CPU time on the CPU), as ``[name, calls, ms, share of the total]``."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
    attr = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, attr) > 0]
    total = sum(getattr(e, attr) for e in events) or 1.0
    events.sort(key=lambda e: getattr(e, attr), reverse=True)
    return [[e.key[:70], e.count, getattr(e, attr) / 1e3, getattr(e, attr) / total] for e in events[:top]]


# ---------------------------------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------------------------------
def _run_subprocess(cmd, timeout):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _run_in_process(worker_argv):
    """The worker in this process (``--in-process``: quick checks; peak memory then means little)."""
    import io
    import traceback

    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            main(worker_argv)
        returncode, err = 0, ""
    except Exception:  # reported in the table as "failed: ..."
        returncode, err = 1, traceback.format_exc()
    return subprocess.CompletedProcess(worker_argv, returncode, out.getvalue(), err)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shapes", nargs="+", help="N,d,V triples (default: per device)")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], help="default: fp32 on CPU, bf16 on CUDA")
    parser.add_argument("--methods", default=None, help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument("--clamp-fraction", type=float, default=0.3)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--chunk-size", type=int, default=None, help="tokens per chunk for ours (default: auto)")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls after the first (0: time the first)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per (shape, method)")
    parser.add_argument("--mem-limit-gib", type=float, default=16.0, help="CPU: address-space cap per worker")
    parser.add_argument(
        "--profile", type=int, default=0, help="also profile one call: its N largest operators/kernels by own time"
    )
    parser.add_argument("--json", default=None, help="also append the results to this JSON-lines file")
    parser.add_argument(
        "--in-process", action="store_true", help="run every method in this process (quick checks, no peak memory)"
    )
    parser.add_argument(
        "--strict", action="store_true", help="exit with status 1 when a method fails (OOM and timeouts included)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    if args.worker:
        if args.mem_limit_gib and args.device == "cpu" and not args.in_process:
            # An allocation past the limit raises in the worker instead of waking the OOM killer on a shared machine.
            limit = int(args.mem_limit_gib * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        worker(args)
        return

    shapes = args.shapes or (CUDA_SHAPES if args.device == "cuda" else CPU_SHAPES)
    excluded = CPU_ONLY if args.device == "cuda" else CUDA_ONLY
    methods = args.methods.split(",") if args.methods else [m for m in METHODS if m not in excluded]
    unknown = set(methods) - set(METHODS)
    if unknown:
        parser.error(f"unknown methods {sorted(unknown)}")
    if set(methods) & excluded:
        parser.error(f"{sorted(set(methods) & excluded)} cannot run with --device {args.device}")

    header = (
        "| method | shape N,d,V | dtype | fwd+bwd wall ms (median) | min wall ms | CPU ms (median) | first call ms "
        "| peak MiB |\n|---|---|---|---|---|---|---|---|"
    )
    print(
        f"device={args.device} clamp_fraction={args.clamp_fraction} temperature={args.temperature} "
        f"repeats={args.repeats} threads={args.threads or 'default'}",
        flush=True,
    )
    print(header, flush=True)
    failures, profiles = [], []
    for shape in shapes:
        for method in methods:
            dtype = "bf16" if method == "ours_cuda_path_emulated" else args.dtype  # that path is bf16
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                "--worker",
                "--method",
                method,
                "--shape",
                shape,
                "--device",
                args.device,
                "--dtype",
                dtype,
                "--clamp-fraction",
                str(args.clamp_fraction),
                "--temperature",
                str(args.temperature),
                "--repeats",
                str(args.repeats),
                "--mem-limit-gib",
                str(args.mem_limit_gib),
            ]
            if args.chunk_size:
                cmd += ["--chunk-size", str(args.chunk_size)]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            if args.profile:
                cmd += ["--profile", str(args.profile)]
            try:
                proc = _run_in_process(cmd[2:]) if args.in_process else _run_subprocess(cmd, args.timeout)
                lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
                if proc.returncode != 0 or not lines:
                    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
                    if proc.returncode in (-9, 137):
                        status = "killed (OOM?)"
                    elif "can't allocate memory" in proc.stderr or "out of memory" in proc.stderr.lower():
                        status = f"OOM (> {args.mem_limit_gib:g} GiB cap)" if args.device == "cpu" else "OOM"
                    else:
                        status = f"failed: {tail[0][:80]}"
                    print(f"| {DESCRIPTIONS[method]} | {shape} | {dtype} | {status} | | | | |", flush=True)
                    failures.append(f"{method} {shape}: {status}\n{proc.stderr[-3000:]}")
                    continue
                res = json.loads(lines[-1][len("RESULT ") :])
            except subprocess.TimeoutExpired:
                print(f"| {DESCRIPTIONS[method]} | {shape} | {dtype} | timeout | | | | |", flush=True)
                failures.append(f"{method} {shape}: timeout")
                continue
            times = res["times_ms"]
            cpu = f"{statistics.median(res['cpu_ms']):.0f}" if res["cpu_ms"] else "n/a"
            print(
                f"| {DESCRIPTIONS[method]} | {shape} | {dtype} | {statistics.median(times):.0f} | "
                f"{min(times):.0f} | {cpu} | {res['first_ms']:.0f} | {res['peak_mib']:.0f} |",
                flush=True,
            )
            if res["profile"]:
                unit = "device" if args.device == "cuda" else "CPU"
                profiles.append(f"\n| {DESCRIPTIONS[method]}, {shape}: own {unit} time | calls | ms | share |")
                profiles.append("|---|---|---|---|")
                profiles += [
                    f"| `{name}` | {calls} | {ms:.1f} | {share:.0%} |" for name, calls, ms, share in res["profile"]
                ]
            if args.json:
                with open(args.json, "a") as f:
                    f.write(
                        json.dumps(
                            {
                                "method": method,
                                "shape": shape,
                                "dtype": dtype,
                                "device": args.device,
                                "clamp_fraction": args.clamp_fraction,
                                **res,
                            }
                        )
                        + "\n"
                    )

    if profiles:
        print("\n".join(profiles), flush=True)
    if failures and args.strict:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
