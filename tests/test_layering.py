"""ui -> telemetry -> engine and api -> engine, never back; analysis is pure pricing; the features (tune,
bench) stay out of the dashboard's way: checked by importing in a clean interpreter."""
from __future__ import annotations

import importlib.util
import pkgutil
import subprocess
import sys

import pytest

import pdtop.analysis
import pdtop.bench
import pdtop.engine
import pdtop.telemetry
import pdtop.tune

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


def test_analysis_is_pure_pricing():
    """analysis prices with the engine's roofline and computes the benchmarks' statistics; it runs no
    server, request or benchmark, so it imports none of the parts that do."""
    loaded = _imported_after(_modules(pdtop.analysis))
    parts = ("pdtop.telemetry", "pdtop.ui", "pdtop.api", "pdtop.tune", "pdtop.bench", "pdtop.commands")
    assert not {m for m in loaded if m.startswith((*parts, "httpx", "textual", "fastapi"))}


def test_tune_and_bench_import_neither_ui_nor_textual():
    loaded = _imported_after(_modules(pdtop.tune) + _modules(pdtop.bench))
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


# The dashboard's Textual-free core: their docstrings promise no Textual, so the model and the live
# tuner run (and are tested) without it. The child reports which of pdtop's imports pulled Textual in.
TEXTUAL_FREE = ["pdtop.ui.state", "pdtop.ui.live_tune", "pdtop.ui.keymap"]


def _textual_import_chain(module: str) -> list[str]:
    """pdtop's import lines that led to the first `textual` import when `module` is imported in a clean
    interpreter; empty if Textual was never imported."""
    code = ("import os, sys, traceback, importlib\n"
            "import pdtop\n"
            "root = os.path.dirname(pdtop.__file__) + os.sep\n"
            "top = os.path.dirname(os.path.dirname(root))\n"
            "chain = []\n"
            "class Watch:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if not chain and name.partition('.')[0] == 'textual':\n"
            "            chain.extend(f'{os.path.relpath(f.filename, top)}:{f.lineno}: {f.line}'\n"
            "                         for f in traceback.extract_stack() if f.filename.startswith(root))\n"
            "            chain.append('-> ' + name)\n"
            "sys.meta_path.insert(0, Watch())\n"
            f"importlib.import_module({module!r})\n"
            "loaded = [m for m in sys.modules if m.partition('.')[0] == 'textual']\n"
            "for line in chain or (['textual loaded'] if loaded else []):\n    print(line)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return out.splitlines()


@pytest.mark.parametrize("module", TEXTUAL_FREE)
def test_dashboard_core_imports_no_textual(module):
    chain = _textual_import_chain(module)
    assert not chain, f"importing {module} loads textual:\n" + "\n".join(chain)
