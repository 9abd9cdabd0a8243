"""ui -> telemetry -> engine and api -> engine, never back: checked by importing in a clean interpreter."""
from __future__ import annotations

import importlib.util
import pkgutil
import subprocess
import sys

import pdtop.engine
import pdtop.telemetry

# Modules that import an optional package at their top (Triton ships only with CUDA builds of torch).
NEEDS = {"pdtop.engine.model.triton_decode": "triton"}


def _modules(pkg) -> list[str]:
    names = [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
    return [n for n in names if n not in NEEDS or importlib.util.find_spec(NEEDS[n]) is not None]


def _imported_after(modules: list[str]) -> set[str]:
    code = ("import importlib, sys\n"
            f"for m in {modules!r}:\n    importlib.import_module(m)\n"
            "print('\\n'.join(sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_engine_imports_neither_telemetry_nor_ui_nor_api_nor_textual():
    loaded = _imported_after(_modules(pdtop.engine))
    assert not {m for m in loaded if m.startswith(("textual", "pdtop.telemetry", "pdtop.ui", "pdtop.api", "fastapi"))}


def test_telemetry_imports_neither_ui_nor_textual():
    loaded = _imported_after(_modules(pdtop.telemetry))
    assert not {m for m in loaded if m.startswith(("textual", "pdtop.ui"))}


def test_every_command_explains_itself():
    from pdtop.cli import SUBCOMMANDS

    top = subprocess.run([sys.executable, "-m", "pdtop", "--help"], capture_output=True, text=True, check=True).stdout
    for name, _, _ in SUBCOMMANDS:
        assert name in top
        sub = subprocess.run([sys.executable, "-m", "pdtop", name, "--help"], capture_output=True, text=True)
        assert sub.returncode == 0, sub.stderr
        assert sub.stdout.startswith("usage: pdtop " + name)


def test_api_imports_neither_telemetry_nor_ui_nor_textual():
    import pdtop.api

    loaded = _imported_after(_modules(pdtop.api))
    assert not {m for m in loaded if m.startswith(("textual", "pdtop.telemetry", "pdtop.ui"))}
