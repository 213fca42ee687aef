#!/usr/bin/env bash
# The loader benchmark on one GPU: the same comparison with DALI "mixed" (nvJPEG) decode in
# flashfeed's Loader, the plain DALI reader and the decode ceiling; PIL peers stay on CPU.
# Sized to finish in under 5 minutes on one GPU machine (corpus build included).
#
#   bash benchmarks/gpu.sh            # writes .bench/loader-gpu.json and prints the table
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
IMAGES=${IMAGES:-5000}
THREADS=${THREADS:-2}

"$PY" - <<'PY'
from nvidia.dali import backend
n = backend.GetCUDADeviceCount()
if n < 1:
    raise SystemExit("benchmarks/gpu.sh: DALI sees no CUDA device; run benchmarks/loader.py on CPU")
print(f"DALI sees {n} CUDA device(s)")
PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

timeout 290 "$PY" benchmarks/loader.py --device gpu --images "$IMAGES" --rounds 2 \
    --threads "$THREADS" --work .bench/loader-gpu --out .bench/loader-gpu.json
