#!/usr/bin/env bash
# The GPU runbook in one call: on a fresh CUDA machine with the project's wheels carried in, run from the repository
# root (tests/ and benchmarks/ are read from there):
#
#   bash benchmarks/gpu_runbook.sh [--wheels DIR] [--out DIR] [--baseline DIR]
#
# 1. installs the wheels found in DIR (--wheels; the project's and any others carried in), without the network;
# 2. the CUDA kernel tests: tests/kernels/test_kernel_cuda.py (fp32 and bf16, both backends, clamp on and off, against
#    float64) and the Triton compile test;
#    then the clamp's selection under several sizes on one chunk of logits (benchmarks/select_sweep.py);
# 3. the kernel benchmark, bf16, N = 16384 at (d, V) = (4096, 151936) and (2048, 32768): naive logits, TRL's chunked
#    head, Liger's chunked GRPO loss, the four LM-head GEMMs alone (the floor), ours (torch and triton, clamp on and
#    off);
# 4. the trainer loss step of a random-initialised ~0.5B Qwen2-architecture model for every trainer against
#    trl.GRPOTrainer;
# 5. one call each of TRL's head, the GEMM floor and ours (Triton, clamp on and off) under torch.profiler (--profile);
#    then the AEnt reference approach (full logits + top-k on the CPU) against ours at N = 2048;
# and writes everything, with the command, the versions and the device line, to OUT/<gpu>-<date>.md (OUT defaults to
# benchmarks/results). A failing stage is recorded and the others still run; the exit status is 1 if any failed.
#
# RUNBOOK_COMMIT names the commit where the copy has no git history (the device tool's copy of the working tree).
#
# --baseline DIR measures an earlier library beside this one in the same call: DIR is its source tree, unpacked with
#   git archive REV | (mkdir -p .baseline && tar -x -C .baseline) && echo REV > .baseline/REVISION
# (.baseline is ignored by git; carry it to the GPU machine). Its own kernel_bench.py and step_bench.py run with DIR
# first on PYTHONPATH, right after this library's, on TRL's head, ours (Triton, clamp 0 and 0.3) and every trainer's
# loss step.
#
# --dry-run runs every stage at toy sizes on the CPU (the CUDA tests on the CPU, the benchmarks in-process), so that
# the runbook is known to work before GPU time is spent on it (tests/launch/test_gpu_runbook.py runs it in CI).
set -uo pipefail

DRY_RUN=0
OUT_DIR="benchmarks/results"
WHEELS=""
BASELINE=""
PYTHON="${PYTHON:-python}"
COMMAND="bash benchmarks/gpu_runbook.sh $*"
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --out) OUT_DIR="$2"; shift ;;
        --wheels) WHEELS="$2"; shift ;;
        --baseline) BASELINE="$(cd "$2" && pwd)" || exit 2; shift ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
cd "$(dirname "$0")/.." || exit 2
mkdir -p "$OUT_DIR"

if [ -n "$WHEELS" ] && [ "$DRY_RUN" = 0 ]; then
    "$PYTHON" -m pip install --no-index --find-links "$WHEELS" "$WHEELS"/*.whl || exit 2
fi

if [ "$DRY_RUN" = 1 ]; then
    GPU="dry-run-cpu"
    DEVICE_LINE="CPU dry run (toy sizes): $(nproc) cores"
else
    GPU="$("$PYTHON" -c 'import torch; print(torch.cuda.get_device_name(0).replace(" ", "-"))')" || exit 2
    DEVICE_LINE="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
fi
REPORT="$OUT_DIR/$GPU-$(date +%Y-%m-%d).md"
VERSIONS="$("$PYTHON" - <<'EOF'
import importlib.metadata as md
import platform

import torch

names = ["torch", "triton", "trl", "transformers", "liger-kernel", "deepspeed", "trl-entropy"]
found = []
for name in names:
    try:
        found.append(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        found.append(f"{name} (not installed)")
print(f"python {platform.python_version()}, CUDA {torch.version.cuda}, " + ", ".join(found))
EOF
)"

{
    echo "# Kernel and trainer benchmarks: $GPU, $(date +%Y-%m-%d)"
    echo
    echo "* command: \`$COMMAND\`"
    echo "* device: $DEVICE_LINE"
    echo "* versions: $VERSIONS"
    echo "* commit: ${RUNBOOK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
} > "$REPORT"

FAILED=()
stage() {  # stage TITLE COMMAND...: runs it, appends its command and output to the report
    local title="$1"; shift
    echo "== $title: $*"
    {
        echo
        echo "## $title"
        echo
        echo "\`$*\`"
        echo
    } >> "$REPORT"
    local log started=$SECONDS
    log="$(mktemp)"
    "$@" > "$log" 2>&1
    local status=$?
    grep -E '^\||^(preset|parameters|device)=?|[0-9]+ (passed|failed|skipped|error)' "$log" >> "$REPORT"
    { echo; echo "stage time: $((SECONDS - started)) s"; } >> "$REPORT"
    if [ $status -ne 0 ]; then
        FAILED+=("$title")
        { echo; echo "**failed (exit $status)**; last lines:"; echo '```'; tail -20 "$log"; echo '```'; } >> "$REPORT"
    fi
    tail -3 "$log"
    rm -f "$log"
}

# baseline TITLE SCRIPT ARGS...: the baseline's own benchmarks/SCRIPT with ARGS, its library first on the path.
baseline() {
    local title="$1" script="$2"; shift 2
    stage "$title, baseline $(cat "$BASELINE/REVISION" 2>/dev/null || echo "(no REVISION)")" \
        env PYTHONPATH="$BASELINE${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" "$BASELINE/benchmarks/$script" "$@"
}

if [ -n "$BASELINE" ]; then
    # The baseline's package must be the one its benchmarks import, not this one's installed copy (-P: the path a
    # script has, without the working directory that -c would put first).
    stage "Baseline library" env PYTHONPATH="$BASELINE${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -P -c '
import sys, trl_entropy
where = trl_entropy.__file__
print(f"| baseline library | {where} |")
sys.exit(0 if where.startswith(sys.argv[1] + "/") else f"the baseline resolved to {where}, not under {sys.argv[1]}")
' "$BASELINE"
fi

if [ "$DRY_RUN" = 1 ]; then
    KERNEL_TEST_DEVICE=cpu stage "CUDA kernel tests (dry run: on the CPU, PyTorch backend)" \
        "$PYTHON" -m pytest -q -p no:cacheprovider tests/kernels/test_kernel_cuda.py
    stage "Clamp selection sizes (dry run: the Triton interpreter)" "$PYTHON" benchmarks/select_sweep.py --dry-run
    stage "Kernel benchmark (dry run)" "$PYTHON" benchmarks/kernel_bench.py --in-process --strict --repeats 1 \
        --shapes 64,16,512 --methods naive,reference,trl,liger,gemm_floor,ours,ours_noclamp --profile 3
    stage "Trainer loss step (dry run: toy Qwen2)" "$PYTHON" benchmarks/step_bench.py --preset toy --repeats 1
    if [ -n "$BASELINE" ]; then
        baseline "Kernel benchmark (dry run)" kernel_bench.py --in-process --strict --repeats 1 --shapes 64,16,512 \
            --methods trl,ours_noclamp,ours
        baseline "Trainer loss step (dry run: toy Qwen2)" step_bench.py --preset toy --repeats 1
    fi
else
    stage "CUDA kernel tests" "$PYTHON" -m pytest -q -p no:cacheprovider tests/kernels/test_kernel_cuda.py \
        tests/kernels/test_kernel_triton.py::test_triton_kernels_compile_for_cuda
    stage "Clamp selection sizes (one chunk of fp32 logits, V 151,936)" "$PYTHON" benchmarks/select_sweep.py \
        --device cuda
    # Each (shape, method) runs in its own process under --timeout. The baseline's stages follow their counterparts,
    # before the stages the earlier records already hold, so that a call cut short keeps the comparison.
    stage "Kernel benchmark (bf16)" "$PYTHON" benchmarks/kernel_bench.py --device cuda --dtype bf16 --repeats 3 \
        --timeout 60 --shapes 16384,4096,151936 16384,2048,32768 \
        --methods naive,trl,liger,gemm_floor,ours,ours_noclamp,ours_triton,ours_triton_noclamp
    if [ -n "$BASELINE" ]; then
        baseline "Kernel benchmark (bf16)" kernel_bench.py --device cuda --dtype bf16 --repeats 3 --timeout 60 \
            --shapes 16384,4096,151936 --methods trl,ours_triton_noclamp,ours_triton
    fi
    stage "Trainer loss step (random-initialised ~0.5B Qwen2, bf16)" "$PYTHON" benchmarks/step_bench.py \
        --preset qwen2-0.5b --device cuda --dtype bf16 --repeats 3
    if [ -n "$BASELINE" ]; then
        baseline "Trainer loss step (random-initialised ~0.5B Qwen2, bf16)" step_bench.py --preset qwen2-0.5b \
            --device cuda --dtype bf16 --repeats 3
    fi
    stage "Kernel profile (bf16, one call each: own device time per kernel)" "$PYTHON" benchmarks/kernel_bench.py \
        --device cuda --dtype bf16 --repeats 1 --timeout 60 --profile 12 --shapes 16384,4096,151936 \
        --methods trl,gemm_floor,ours_triton_noclamp,ours_triton
    # The AEnt reference sorts the full logits on the CPU (minutes at N = 16384), so it runs at N = 2048 beside ours.
    stage "Kernel benchmark against the AEnt reference (bf16)" "$PYTHON" benchmarks/kernel_bench.py --device cuda \
        --dtype bf16 --repeats 1 --timeout 60 --shapes 2048,4096,151936 --methods reference,ours,ours_triton
fi

if [ ${#FAILED[@]} -gt 0 ]; then
    echo "failed stages: ${FAILED[*]} (report: $REPORT)" >&2
    exit 1
fi
echo "report: $REPORT"
