#!/usr/bin/env bash
# The benchmark suite on one GPU: limits, the loader stage with DALI "mixed" (nvJPEG) decode
# in flashfeed's Loader, the plain DALI reader and the decode ceiling (PIL peers stay on CPU),
# and the stall log, at smoke-check sizes so it finishes in under 5 minutes.
# Writes benchmarks/results/<date>-<host>-quick-gpu.json (the suite's JSON shape: the GPU is
# named in its machine.gpu field), its PNGs and Markdown table.
#
#   bash benchmarks/gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

"$PY" - <<'PY'
from nvidia.dali import backend
n = backend.GetCUDADeviceCount()
if n < 1:
    raise SystemExit("benchmarks/gpu.sh: DALI sees no CUDA device; run `make bench` on CPU")
print(f"DALI sees {n} CUDA device(s)")
PY
GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1 || true)
echo "GPU: $GPU"

FLASHFEED_BENCH_GPU="$GPU" timeout 290 "$PY" benchmarks/suite.py --quick --device gpu \
    --stages limits,loader,stalls --work .bench/suite-gpu
