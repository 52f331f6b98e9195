#!/usr/bin/env bash
# The GPU runbook in one call: on a fresh CUDA machine with the project's wheels carried in, run from the repository
# root (tests/ and benchmarks/ are read from there):
#
#   bash benchmarks/gpu_runbook.sh [--wheels DIR] [--out DIR] [--baseline DIR] [--budget SECONDS] [--stages LIST]
#
# installs the wheels found in DIR (--wheels; the project's and any others carried in), without the network, then
# runs these stages, in this order (the targets' figures first, so that a call cut short keeps them):
#
#   tests            the CUDA kernel tests: tests/kernels/test_kernel_cuda.py (fp32 and bf16, both backends, clamp on
#                    and off, against float64) and the Triton compile test;
#   kernel           the kernel benchmark, bf16, N = 16384, d = 4096, V = 151936: naive logits, TRL's chunked head,
#                    the four LM-head GEMMs alone (the floor), ours (Triton, clamp on and off);
#   kernel-baseline  the baseline's own kernel benchmark on TRL's head and ours (Triton, clamp 0 and 0.3);
#   step             the trainer loss step of a random-initialised ~0.5B Qwen2-architecture model for every trainer
#                    against trl.GRPOTrainer;
#   step-baseline    the same with the baseline's library and step benchmark;
#   sweep            the clamp's selection under several sizes on one chunk of logits (benchmarks/select_sweep.py);
#   profile          one call each of TRL's head, the GEMM floor and ours (Triton, clamp on and off) under
#                    torch.profiler (--profile);
#   kernel-more      the rest of the kernel benchmark: Liger's chunked GRPO loss and the torch path at that shape,
#                    every method at (d, V) = (2048, 32768), and the AEnt reference (full logits + top-k on the CPU)
#                    beside ours at N = 2048;
#
# and writes everything, with the command, the versions, the device line and each stage's time, to
# OUT/<gpu>-<date>.md (OUT defaults to benchmarks/results). A failing stage is recorded and the others still run; the
# exit status is 1 if any failed.
#
# --budget SECONDS (default 480 on a GPU, none in a dry run) bounds the whole call: each stage runs under the time
#   left (`timeout`), a stage still running when it is spent is stopped with its rows so far kept and marked "cut at
#   the budget", and the stages after it are listed as not run. --stages LIST (comma-separated names from above) runs
#   those only, in the order above.
#
# RUNBOOK_COMMIT names the commit where the copy has no git history (the device tool's copy of the working tree).
#
# --baseline DIR measures an earlier library beside this one in the same call: DIR is its source tree, unpacked with
#   git archive REV | (mkdir -p .baseline && tar -x -C .baseline) && echo REV > .baseline/REVISION
# (.baseline is ignored by git; carry it to the GPU machine). Its own kernel_bench.py and step_bench.py run with DIR
# first on PYTHONPATH.
#
# --dry-run runs every stage at toy sizes on the CPU (the CUDA tests on the CPU, the benchmarks in-process), so that
# the runbook is known to work before GPU time is spent on it (tests/launch/test_gpu_runbook.py runs it in CI).
set -uo pipefail

STAGES_ALL="tests,kernel,kernel-baseline,step,step-baseline,sweep,profile,kernel-more"
DRY_RUN=0
OUT_DIR="benchmarks/results"
WHEELS=""
BASELINE=""
BUDGET=""
STAGES="$STAGES_ALL"
PYTHON="${PYTHON:-python}"
COMMAND="bash benchmarks/gpu_runbook.sh $*"
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --out) OUT_DIR="$2"; shift ;;
        --wheels) WHEELS="$2"; shift ;;
        --baseline) BASELINE="$(cd "$2" && pwd)" || exit 2; shift ;;
        --budget) BUDGET="$2"; shift ;;
        --stages) STAGES="$2"; shift ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
    shift
done
if [ -n "$BUDGET" ] && ! [[ "$BUDGET" =~ ^[0-9]+$ ]]; then
    echo "--budget takes whole seconds, got '$BUDGET'" >&2; exit 2
fi
[ -z "$BUDGET" ] && [ "$DRY_RUN" = 0 ] && BUDGET=480
for name in ${STAGES//,/ }; do
    case ",$STAGES_ALL," in
        *",$name,"*) ;;
        *) echo "--stages: unknown stage '$name'; the stages are $STAGES_ALL" >&2; exit 2 ;;
    esac
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
    echo "* budget: ${BUDGET:-none} s; stages: $STAGES"
} > "$REPORT"

STARTED=$SECONDS
FAILED=()
CUT=()
NOT_RUN=()
stage() {  # stage TITLE COMMAND...: runs it within the budget left, appends its command and output to the report
    local title="$1"; shift
    local left=""
    if [ -n "$BUDGET" ]; then
        left=$((BUDGET - (SECONDS - STARTED)))
        if [ "$left" -le 0 ]; then
            NOT_RUN+=("$title")
            { echo; echo "## $title"; echo; echo "**not run**: the budget of $BUDGET s was spent"; } >> "$REPORT"
            echo "== $title: not run (budget spent)"
            return
        fi
    fi
    echo "== $title: $*"
    {
        echo
        echo "## $title"
        echo
        echo "\`$*\`"
        echo
    } >> "$REPORT"
    local log started=$SECONDS status
    log="$(mktemp)"
    if [ -n "$left" ]; then
        timeout --kill-after=10 "$left" "$@" > "$log" 2>&1
    else
        "$@" > "$log" 2>&1
    fi
    status=$?
    grep -E '^\||^(preset|parameters|device)=?|[0-9]+ (passed|failed|skipped|error)' "$log" >> "$REPORT"
    { echo; echo "stage time: $((SECONDS - started)) s"; } >> "$REPORT"
    if [ -n "$left" ] && { [ $status -eq 124 ] || [ $status -eq 137 ]; }; then
        CUT+=("$title")
        echo "**cut at the budget** of $BUDGET s, after $((SECONDS - started)) s: the rows above are the ones done" >> "$REPORT"
    elif [ $status -ne 0 ]; then
        FAILED+=("$title")
        { echo; echo "**failed (exit $status)**; last lines:"; echo '```'; tail -20 "$log"; echo '```'; } >> "$REPORT"
    fi
    tail -3 "$log"
    rm -f "$log"
}

want() { case ",$STAGES," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# baseline TITLE SCRIPT ARGS...: the baseline's own benchmarks/SCRIPT with ARGS, its library first on the path.
baseline() {
    local title="$1" script="$2"; shift 2
    stage "$title, baseline $(cat "$BASELINE/REVISION" 2>/dev/null || echo "(no REVISION)")" \
        env PYTHONPATH="$BASELINE${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" "$BASELINE/benchmarks/$script" "$@"
}

if [ -n "$BASELINE" ] && { want kernel-baseline || want step-baseline; }; then
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
    KERNEL="--in-process --strict --repeats 1"
    BIG="64,16,512"
    want tests && KERNEL_TEST_DEVICE=cpu stage "CUDA kernel tests (dry run: on the CPU, PyTorch backend)" \
        "$PYTHON" -m pytest -q -p no:cacheprovider tests/kernels/test_kernel_cuda.py
    want kernel && stage "Kernel benchmark (dry run)" "$PYTHON" benchmarks/kernel_bench.py $KERNEL --shapes $BIG \
        --methods naive,trl,gemm_floor,ours,ours_noclamp
    [ -n "$BASELINE" ] && want kernel-baseline && baseline "Kernel benchmark (dry run)" kernel_bench.py $KERNEL \
        --shapes $BIG --methods trl,ours_noclamp,ours
    want step && stage "Trainer loss step (dry run: toy Qwen2)" "$PYTHON" benchmarks/step_bench.py --preset toy \
        --repeats 1
    [ -n "$BASELINE" ] && want step-baseline && baseline "Trainer loss step (dry run: toy Qwen2)" step_bench.py \
        --preset toy --repeats 1
    want sweep && stage "Clamp selection sizes (dry run: the Triton interpreter)" "$PYTHON" benchmarks/select_sweep.py \
        --dry-run
    want profile && stage "Kernel profile (dry run)" "$PYTHON" benchmarks/kernel_bench.py $KERNEL --profile 3 \
        --shapes $BIG --methods trl,gemm_floor,ours_noclamp,ours
    want kernel-more && stage "Kernel benchmark, the other rows (dry run)" "$PYTHON" benchmarks/kernel_bench.py \
        $KERNEL --shapes $BIG --methods liger,reference
else
    KERNEL="--device cuda --dtype bf16 --timeout 60"
    BIG="16384,4096,151936"
    want tests && stage "CUDA kernel tests" "$PYTHON" -m pytest -q -p no:cacheprovider \
        tests/kernels/test_kernel_cuda.py tests/kernels/test_kernel_triton.py::test_triton_kernels_compile_for_cuda
    # Each (shape, method) runs in its own process under --timeout.
    want kernel && stage "Kernel benchmark (bf16)" "$PYTHON" benchmarks/kernel_bench.py $KERNEL --repeats 3 \
        --shapes $BIG --methods naive,trl,gemm_floor,ours_triton,ours_triton_noclamp
    [ -n "$BASELINE" ] && want kernel-baseline && baseline "Kernel benchmark (bf16)" kernel_bench.py $KERNEL \
        --repeats 3 --shapes $BIG --methods trl,ours_triton_noclamp,ours_triton
    want step && stage "Trainer loss step (random-initialised ~0.5B Qwen2, bf16)" "$PYTHON" benchmarks/step_bench.py \
        --preset qwen2-0.5b --device cuda --dtype bf16 --repeats 3
    [ -n "$BASELINE" ] && want step-baseline && baseline "Trainer loss step (random-initialised ~0.5B Qwen2, bf16)" \
        step_bench.py --preset qwen2-0.5b --device cuda --dtype bf16 --repeats 3
    want sweep && stage "Clamp selection sizes (one chunk of fp32 logits, V 151,936)" "$PYTHON" \
        benchmarks/select_sweep.py --device cuda
    want profile && stage "Kernel profile (bf16, one call each: own device time per kernel)" "$PYTHON" \
        benchmarks/kernel_bench.py $KERNEL --repeats 1 --profile 12 --shapes $BIG \
        --methods trl,gemm_floor,ours_triton_noclamp,ours_triton
    if want kernel-more; then
        stage "Kernel benchmark, the other rows (bf16)" "$PYTHON" benchmarks/kernel_bench.py $KERNEL --repeats 3 \
            --shapes $BIG --methods liger,ours,ours_noclamp
        stage "Kernel benchmark at d 2048, V 32768 (bf16)" "$PYTHON" benchmarks/kernel_bench.py $KERNEL --repeats 3 \
            --shapes 16384,2048,32768 \
            --methods naive,trl,liger,gemm_floor,ours,ours_noclamp,ours_triton,ours_triton_noclamp
        # The AEnt reference sorts the full logits on the CPU (minutes at N = 16384), so it runs at N = 2048 beside ours.
        stage "Kernel benchmark against the AEnt reference (bf16)" "$PYTHON" benchmarks/kernel_bench.py $KERNEL \
            --repeats 1 --shapes 2048,4096,151936 --methods reference,ours,ours_triton
    fi
fi

{
    echo
    echo "## Summary"
    echo
    echo "* total time: $((SECONDS - STARTED)) s (budget: ${BUDGET:-none})"
    [ ${#CUT[@]} -gt 0 ] && echo "* cut at the budget: ${CUT[*]}"
    [ ${#NOT_RUN[@]} -gt 0 ] && echo "* not run (budget spent): ${NOT_RUN[*]}"
    [ ${#FAILED[@]} -gt 0 ] && echo "* failed: ${FAILED[*]}"
} >> "$REPORT"
if [ ${#FAILED[@]} -gt 0 ]; then
    echo "failed stages: ${FAILED[*]} (report: $REPORT)" >&2
    exit 1
fi
echo "report: $REPORT"
