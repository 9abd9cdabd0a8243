"""The docs name files that exist: every path in backticks in docs/*.md and README.md."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
# Paths from the repository root; anything else ending in .py is a tail of a file in pdtop/
# (`model/llama.py` in a section about pdtop/engine/, say).
ROOTED = ("pdtop/", "tests/", "bench/", "docs/", "themes/")
# Other projects' files, cited where pdtop follows them (docs/levels.md: SGLang).
ELSEWHERE = {"python/sglang/srt/multiplex/pdmux_context.py", "multiplexing_mixin.py",
             "test/registered/unit/multiplex/test_pdmux_overlap_streams.py",
             "python/sglang/srt/arg_groups/validation_hook.py"}  # in SGLang
PACKAGE_FILES = [p.relative_to(ROOT).as_posix() for p in (ROOT / "pdtop").rglob("*.py")]


def _named_paths(doc: Path) -> list[str]:
    """Backticked words that are paths: rooted ones, and anything ending in .py (`x.py::name` -> x.py)."""
    words = (w.split("::")[0] for w in re.findall(r"`([^`\s]+)`", doc.read_text()))
    return [w for w in words if w.startswith(ROOTED) or w.endswith(".py")]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_named_path_exists(doc):
    missing = []
    for path in _named_paths(doc):
        if path in ELSEWHERE:
            continue
        if path.startswith(ROOTED):
            found = any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()
        else:
            found = any(f == path or f.endswith("/" + path) for f in PACKAGE_FILES)
        if not found:
            missing.append(path)
    assert not missing, f"{doc.name} names files that do not exist: {missing}"


def test_the_check_sees_the_architecture_tables():
    named = _named_paths(ROOT / "docs" / "architecture.md")
    assert {"model/gguf_file.py", "runtime/block_pool.py", "pdtop/analysis/metrics.py", "server/inbox.py"} <= set(named)
