#!/usr/bin/env bash
# Everything a lent GPU machine runs, in one call (docs/gpu.md, "Running the GPU check on a lent
# machine"): the wheels from bench/gpu_prepare.sh if carried (.whl/), the preflight
# (bench/gpu_preflight.sh: compiler, Python.h, libcuda, TRITON_CACHE_DIR, one Triton kernel, then every
# Triton kernel the check and the tests need, compiled ahead in parallel), the GPU check, then the cuda
# tests. All of it within $GPU_RUN_TOTAL_S (470) seconds, machine start excluded. The check comes first
# and gets what the steps before it left, up to 330 s, keeping 60 s for the tests; the tests get what
# the check leaves (docs/gpu.md has the arithmetic). The device time lent is 15 minutes with a start of
# a few: one full try, and time to rerun a try that broke early.
# Results go to $OUT (at most 7 files), named after the GPU where they are its figures: gpu_check-GPU.json
# and gpu_check-GPU.log (GPU from nvidia-smi's name: h100, h200; nogpu where it names none), and
# nvidia_smi.txt, preflight.txt, triton_warm.log, pytest_cuda.log.
# PYTHON picks the interpreter (default python3: on the lent machine, the one with CUDA torch).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/pdtop-gpu}
PY=${PYTHON:-python3}
TOTAL=${GPU_RUN_TOTAL_S:-470}
TESTS_MIN_S=60  # the tests' floor: what the check may not take
CHECK_MAX_S=330
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SECONDS=0

gpu_slug() {  # "NVIDIA H100 80GB HBM3" -> h100, "NVIDIA H200" -> h200, "NVIDIA A100-SXM4-80GB" -> a100
  local w
  for w in $(printf '%s' "$1" | tr '[:upper:]' '[:lower:]' | tr -c 'a-z0-9' ' '); do
    case $w in nvidia|tesla|geforce|quadro|rtx) ;; *[0-9]*) echo "$w"; return ;; esac
  done
  echo nogpu
}

if ls .whl/*.whl >/dev/null 2>&1; then
  # pip, else (a python3 without pip) the wheels unzipped: pure zips of a package and its .so, no deps. A pip
  # that refuses them (another Python than the wheels' 3.12) is believed: nothing is unzipped over it.
  if timeout -k 5 10 "$PY" -m pip --version >/dev/null 2>&1; then
    install=(timeout -k 5 30 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade
             --target /tmp/pdtop-site .whl/*.whl)
  else
    install=(timeout -k 5 30 "$PY" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]'
             /tmp/pdtop-site .whl/*.whl)
  fi
  if "${install[@]}"; then
    export PYTHONPATH=/tmp/pdtop-site${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "gpu_run: the carried wheels did not install; going on without them"
  fi
fi
{ timeout -k 5 10 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.sm --format=csv \
  || echo "nvidia-smi failed (exit $?)"; } 2>&1 | tee "$OUT/nvidia_smi.txt"
gpu_name=$(timeout -k 5 10 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
gpu=$(gpu_slug "$gpu_name")
echo "gpu_run: GPU '${gpu_name:-none}': results gpu_check-$gpu.json and gpu_check-$gpu.log"
# sourced (not piped), so its exports (TRITON_CACHE_DIR, CC) hold for the check and the tests
. bench/gpu_preflight.sh >"$OUT/preflight.txt" 2>&1
cat "$OUT/preflight.txt"
# gpu_check keeps to its own budget (10 s under its timeout) and saves its JSON, verdict included, after
# every section; the timeout (SIGTERM, then SIGKILL 10 s later) only catches a hang. The tests' floor
# (and their kill's 5 s) is kept back: whatever the steps before took, the whole run ends within TOTAL.
check_s=$(( TOTAL - SECONDS - 10 - 10 - TESTS_MIN_S - 5 ))  # its kill, the import probe, the tests, their kill
[ "$check_s" -gt "$CHECK_MAX_S" ] && check_s=$CHECK_MAX_S
[ "$check_s" -lt 30 ] && check_s=30
echo "gpu_run: ${SECONDS} s before the check; it gets ${check_s} s (budget $((check_s - 10)) s)"
timeout -k 10 "$check_s" "$PY" bench/gpu_check.py --out "$OUT/gpu_check-$gpu.json" --budget $((check_s - 10)) 2>&1 \
  | tee "$OUT/gpu_check-$gpu.log"
rc=${PIPESTATUS[0]}; echo "gpu_run: gpu_check exit $rc$( [ "$rc" = 124 ] && echo ': timed out')"
# quickest first, `pdtop tune` (about 30 s) last: a test cut short by the timeout costs the least there
tests="tests/engine/devices/test_cuda.py tests/engine/devices/test_cuda_gpu.py tests/engine/runtime/test_cuda_graphs_gpu.py tests/engine/model/test_model.py"
if timeout -k 2 10 "$PY" -c "import websockets, orjson" 2>/dev/null; then  # tests/telemetry's conftest needs them
  tests="$tests tests/telemetry/hardware/test_nvml_sampler.py"
fi
tests="$tests tests/tune/test_tune_cuda.py"
# the tests get whatever the check left of the total, at least their floor
pytest_s=$(( TOTAL - SECONDS - 5 ))
[ "$pytest_s" -lt "$TESTS_MIN_S" ] && pytest_s=$TESTS_MIN_S
echo "gpu_run: ${SECONDS} s before the tests; they get ${pytest_s} s"
# shellcheck disable=SC2086
timeout -k 5 "$pytest_s" "$PY" -m pytest -q -m cuda -p no:cacheprovider -o addopts="" $tests 2>&1 \
  | tee "$OUT/pytest_cuda.log"
rc=${PIPESTATUS[0]}; echo "gpu_run: pytest exit $rc$( [ "$rc" = 124 ] && echo ': timed out')"
echo "gpu_run: ${SECONDS} s in all"
