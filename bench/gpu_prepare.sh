#!/usr/bin/env bash
# Run on the development machine (it reaches PyPI) before `bench/gpu_run.sh` on a lent GPU machine
# (which does not): downloads into .whl/ (ignored by git, sent with the run's `carry: [".whl"]`) the
# Python 3.12 wheels the GPU machine lacks and the GPU tests need. gpu_check.py itself needs none:
# only tests/telemetry/hardware/test_nvml_sampler.py does (its conftest imports the telemetry server: websockets
# and orjson), and tests/tune/test_tune_cuda.py does (optuna and its pure-Python or cp312 dependencies; numpy and
# typing_extensions come with CUDA torch). About 7 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --platform any -d .whl "websockets==15.0.1" "orjson==3.11.3" \
  "optuna==5.1.0" "alembic==1.20.1" "SQLAlchemy==2.1.9" "Mako==1.4.3" "MarkupSafe==3.0.4" "colorlog==6.12.0" \
  "tqdm==4.70.1" "PyYAML==6.0.4"
ls -l .whl
