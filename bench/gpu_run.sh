#!/usr/bin/env bash
# Everything a lent GPU machine runs, in one call (docs/gpu.md, "Running the GPU check"):
# the wheels from bench/gpu_prepare.sh if carried, the GPU check (280 s at most), then the cuda tests
# (60 s at most). Results go to $OUT: gpu_check.json, gpu_check.log, pytest_cuda.log, nvidia_smi.txt.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/pdtop-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/pdtop-site \
    .whl/*.whl && export PYTHONPATH=/tmp/pdtop-site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee "$OUT/nvidia_smi.txt"
timeout 280 python3 bench/gpu_check.py --out "$OUT/gpu_check.json" 2>&1 | tee "$OUT/gpu_check.log"
echo "gpu_check exit ${PIPESTATUS[0]}"
tests="tests/engine/test_cuda.py tests/engine/test_cuda_gpu.py"
if python3 -c "import websockets" 2>/dev/null; then
  tests="$tests tests/telemetry/test_nvml_sampler.py"
fi
# shellcheck disable=SC2086
timeout 60 python3 -m pytest -q -m cuda -p no:cacheprovider -o addopts="" $tests 2>&1 | tee "$OUT/pytest_cuda.log"
echo "pytest exit ${PIPESTATUS[0]}"
