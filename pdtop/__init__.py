"""pdtop: `top` for PD multiplexing.

Importing pdtop sets how OpenMP team threads wait between parallel regions (`THREAD_WAIT`),
unless torch is already imported (too late: libgomp reads it once, at load) or the
environment already chooses (OMP_WAIT_POLICY or GOMP_SPINCOUNT set, or PDTOP_THREAD_WAIT=unset).
Measured with bench/omp_wait.py; docs/levels.md ("OpenMP threads") has the figures.
"""
import os as _os
import sys as _sys

__version__ = "0.1.0"

THREAD_WAIT = {"OMP_WAIT_POLICY": "PASSIVE"}

if "torch" not in _sys.modules and _os.environ.get("PDTOP_THREAD_WAIT") != "unset" \
        and not {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & _os.environ.keys():
    _os.environ.update(THREAD_WAIT)
