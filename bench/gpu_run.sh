#!/usr/bin/env bash
# Everything a lent GPU machine runs, in one call (docs/gpu.md, "Running the GPU check on a lent
# machine"): the wheels from bench/gpu_prepare.sh if carried (.whl/), the preflight
# (bench/gpu_preflight.sh: compiler, Python.h, libcuda, TRITON_CACHE_DIR, one Triton kernel), the GPU
# check, then the cuda tests. All of it within $GPU_RUN_TOTAL_S (470) seconds, machine start excluded:
# the check gets what the steps before it left, up to 280 s; the tests at least 120 s, and what the check leaves.
# The device time lent is 15 minutes with a start of a few: one try is what there is.
# Results go to $OUT (5 files): nvidia_smi.txt, preflight.txt, gpu_check.json, gpu_check.log,
# pytest_cuda.log. PYTHON picks the interpreter (default python3: on the lent machine, the one with CUDA torch).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/pdtop-gpu}
PY=${PYTHON:-python3}
TOTAL=${GPU_RUN_TOTAL_S:-470}
PYTEST_S=120
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SECONDS=0
if ls .whl/*.whl >/dev/null 2>&1; then
  # pip, else (a python3 without pip) the wheels unzipped: pure zips of a package and its .so, no deps
  if timeout -k 5 30 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/pdtop-site .whl/*.whl \
    || timeout -k 5 30 "$PY" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
      /tmp/pdtop-site .whl/*.whl; then
    export PYTHONPATH=/tmp/pdtop-site${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "gpu_run: the carried wheels did not install; going on without them"
  fi
fi
{ timeout -k 5 10 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.sm --format=csv \
  || echo "nvidia-smi failed (exit $?)"; } 2>&1 | tee "$OUT/nvidia_smi.txt"
# sourced (not piped), so its exports (TRITON_CACHE_DIR, CC) hold for the check and the tests
. bench/gpu_preflight.sh >"$OUT/preflight.txt" 2>&1
cat "$OUT/preflight.txt"
# gpu_check keeps to its own budget (10 s under its timeout) and saves its JSON after every section;
# the timeout (SIGTERM, then SIGKILL 10 s later) only catches a hang. The tests' time (and their
# kill's 5 s) is kept back: whatever the steps before took, the whole run ends within TOTAL.
check_s=$(( TOTAL - SECONDS - 10 - 10 - PYTEST_S - 5 ))  # its kill, the import probe, the tests, their kill
[ "$check_s" -gt 280 ] && check_s=280
[ "$check_s" -lt 30 ] && check_s=30
echo "gpu_run: ${SECONDS} s before the check; it gets ${check_s} s (budget $((check_s - 10)) s)"
timeout -k 10 "$check_s" "$PY" bench/gpu_check.py --out "$OUT/gpu_check.json" --budget $((check_s - 10)) 2>&1 \
  | tee "$OUT/gpu_check.log"
rc=${PIPESTATUS[0]}; echo "gpu_run: gpu_check exit $rc$( [ "$rc" = 124 ] && echo ': timed out')"
tests="tests/engine/devices/test_cuda.py tests/engine/devices/test_cuda_gpu.py tests/engine/runtime/test_cuda_graphs_gpu.py tests/engine/model/test_model.py tests/tune/test_tune_cuda.py"
if "$PY" -c "import websockets, orjson" 2>/dev/null; then  # tests/telemetry's conftest needs them (carried as wheels)
  tests="$tests tests/telemetry/test_nvml_sampler.py"
fi
# the tests get at least their 120 s, and whatever the check left of the total (cold Triton compiles of the
# small models' kernels, about 20 of them, are most of their time)
pytest_s=$(( TOTAL - SECONDS - 5 ))
[ "$pytest_s" -lt "$PYTEST_S" ] && pytest_s=$PYTEST_S
echo "gpu_run: ${SECONDS} s before the tests; they get ${pytest_s} s"
# shellcheck disable=SC2086
timeout -k 5 "$pytest_s" "$PY" -m pytest -q -m cuda -p no:cacheprovider -o addopts="" $tests 2>&1 \
  | tee "$OUT/pytest_cuda.log"
rc=${PIPESTATUS[0]}; echo "gpu_run: pytest exit $rc$( [ "$rc" = 124 ] && echo ': timed out')"
echo "gpu_run: ${SECONDS} s in all"
