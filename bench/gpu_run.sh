#!/usr/bin/env bash
# Everything a lent GPU machine runs, in one call (docs/gpu.md, "Running the GPU check on a lent
# machine"): the wheels from bench/gpu_prepare.sh if carried (.whl/), the GPU check (280 s at most),
# then the cuda tests (60 s at most). About 6 minutes in all, so a second try fits in 15.
# Results go to $OUT: nvidia_smi.txt, gpu_check.json, gpu_check.log, pytest_cuda.log.
# PYTHON picks the interpreter (default python3: on the lent machine, the one with CUDA torch).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/pdtop-gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/pdtop-site \
      .whl/*.whl; then
    export PYTHONPATH=/tmp/pdtop-site${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "gpu_run: the carried wheels did not install; going on without them"
  fi
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.sm --format=csv \
  || echo "nvidia-smi failed (exit $?)"; } 2>&1 | tee "$OUT/nvidia_smi.txt"
# gpu_check keeps to its own 270 s budget and saves its JSON after every section; the timeout
# (SIGTERM, then SIGKILL 10 s later) only catches a hang.
timeout -k 10 280 "$PY" bench/gpu_check.py --out "$OUT/gpu_check.json" 2>&1 | tee "$OUT/gpu_check.log"
rc=${PIPESTATUS[0]}; echo "gpu_run: gpu_check exit $rc$( [ "$rc" = 124 ] && echo ': timed out')"
tests="tests/engine/devices/test_cuda.py tests/engine/devices/test_cuda_gpu.py tests/engine/runtime/test_cuda_graphs_gpu.py tests/engine/model/test_model.py tests/analysis/test_tune_cuda.py"
if "$PY" -c "import websockets, orjson" 2>/dev/null; then  # tests/telemetry's conftest needs them (carried as wheels)
  tests="$tests tests/telemetry/test_nvml_sampler.py"
fi
# shellcheck disable=SC2086
timeout -k 5 60 "$PY" -m pytest -q -m cuda -p no:cacheprovider -o addopts="" $tests 2>&1 | tee "$OUT/pytest_cuda.log"
rc=${PIPESTATUS[0]}; echo "gpu_run: pytest exit $rc$( [ "$rc" = 124 ] && echo ': timed out')"
