"""Telemetry never imports the UI or Textual (ui -> telemetry -> engine)."""
from __future__ import annotations

import pkgutil
import subprocess
import sys

import pdtop.telemetry


def test_telemetry_imports_no_ui_and_no_textual():
    modules = [f"pdtop.telemetry.{m.name}" for m in pkgutil.iter_modules(pdtop.telemetry.__path__)]
    modules += ["pdtop.commands.serve", "pdtop.commands.record"]
    code = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'textual' or m.startswith('pdtop.ui'))\n"
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert "pdtop.telemetry.server" in modules and len(modules) >= 12
