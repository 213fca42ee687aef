#!/usr/bin/env bash
# The GPU path on one GPU, in under 5 minutes, on a bare machine with no network: a Python
# with a CUDA build of torch is all it needs; what else flashfeed needs (DALI, numpy, pyarrow,
# ...) comes from a wheelhouse fetched elsewhere.
#
#   bash benchmarks/gpu.sh [--wheelhouse DIR] [--results DIR] [--work DIR] [--quick] [--cpu]
#
# --cpu runs every stage's code on the CPU at small sizes: a check of the script, not a figure.
#
# Stages, each its own process under its own time limit, each writing
# <results>/<stage>.json as soon as it is done (and summary.md from all of them), so a stage
# that fails or runs out of time loses only itself (see benchmarks/gpu_bench.py):
#   env, corpus (synthetic JPEGs: numpy + Pillow or torchvision), ceiling (DALI mixed decode
#   fed from RAM), loader (Loader img/s vs the ceiling, stall split), tokens (TokenLoader
#   host-to-device GB/s vs pinned cudaMemcpy), exactly_once (2 epochs, ledger by __key__),
#   nvdec (H.264 clips/s, Loader NVDEC decode vs DALI's decoder from RAM; needs PyAV, `av`,
#   in the wheelhouse; skipped with one line without a GPU).
#
# A wheelhouse for a Python 3.12 machine with a CUDA 13 torch, made where there is network:
#   pip download -d wheels --only-binary=:all: --python-version 3.12 \
#       --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
#       nvidia-dali-cuda130 numpy pyarrow fsspec xxhash tqdm filelock pillow av
# Only the wheels whose distribution the machine lacks are installed (no index, no
# dependency resolution) into <work>/site, put first on PYTHONPATH; a checkout whose flashfeed
# is not installed is made importable through <work>/pkg.
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
WHEELHOUSE=""
WORK=.bench/gpu
RESULTS=""
QUICK=""
CPU=""
while [ $# -gt 0 ]; do
    case "$1" in
        --wheelhouse) WHEELHOUSE=$2; shift 2 ;;
        --work) WORK=$2; shift 2 ;;
        --results) RESULTS=$2; shift 2 ;;
        --quick) QUICK=--quick; shift ;;
        --cpu) CPU=--cpu; shift ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) echo "gpu.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
RESULTS=${RESULTS:-benchmarks/results/gpu-$(date -u +%Y-%m-%d-%H%M)-$(hostname -s 2>/dev/null || echo host)}
mkdir -p "$WORK" "$RESULTS"
WORK=$(cd "$WORK" && pwd)
BENCH="$PY -m benchmarks.gpu_bench"
START=$(date +%s)

if [ -n "$WHEELHOUSE" ]; then
    timeout -k 5 45 $BENCH install --wheelhouse "$WHEELHOUSE" --target "$WORK/site" \
        || echo "gpu.sh: installing from $WHEELHOUSE failed; going on with what is there" >&2
fi
export PYTHONPATH="$WORK/site:$WORK/pkg${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$WORK/pkg"
$BENCH shim --target "$WORK/pkg" || echo "gpu.sh: could not make flashfeed importable" >&2

# stage time limits (seconds): with installing and start-up, well under 300 in all
stage() {
    local name=$1 limit=$2
    echo "== $name (limit ${limit}s, $(( $(date +%s) - START ))s so far)"
    timeout -k 5 "$limit" $BENCH run "$name" --results "$RESULTS" --work "$WORK" $QUICK $CPU
    local rc=$?
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        $BENCH mark "$name" --results "$RESULTS" --status "timeout after ${limit}s"
        echo "   $name: timed out after ${limit}s"
    elif [ $rc -ne 0 ]; then
        $BENCH mark "$name" --results "$RESULTS" --status "failed (exit $rc)"
    fi
}
stage env 20
stage corpus 40
stage ceiling 35
stage loader 50
stage tokens 35
stage exactly_once 45
stage nvdec 45

echo "== done in $(( $(date +%s) - START ))s; results in $RESULTS"
$BENCH summary --results "$RESULTS"
