"""pdtop installed from its wheel: every file the package reads at run time is in it, the dashboard
starts from it, and a dashboard that crashes exits non-zero in every mode (`pdtop`, `attach`, `replay`).

The wheel is built from a copy of the tree (no network, no build isolation) and installed with
`pip install --no-deps --target`; the commands run with only that directory in front of the
dependencies, from a directory outside the source tree, on Textual's headless driver.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEADLESS = "textual.drivers.headless_driver:HeadlessDriver"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("pdtop", "themes"):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                             "-w", str(tmp), str(src)], capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {result.stderr.strip().splitlines()[-1:]}")
    (built,) = tmp.glob("pdtop-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    return target


def _run(site: Path, args: list[str], cwd: Path, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(site), "TEXTUAL_DRIVER": HEADLESS, **env}
    return subprocess.run([sys.executable, "-m", "pdtop", *args], cwd=cwd, env=environment, capture_output=True,
                          text=True, timeout=timeout)


def test_the_wheel_holds_every_file_the_package_reads(wheel):
    """Every non-Python file under pdtop/ (themes through their link, the stylesheet, data) is in the wheel."""
    needed = set()
    for folder, _dirs, files in os.walk(ROOT / "pdtop", followlinks=True):
        if "__pycache__" in folder:
            continue
        for name in files:
            if not name.endswith((".py", ".pyc")):
                needed.add((Path(folder) / name).relative_to(ROOT).as_posix())
    assert {"pdtop/ui/app.tcss", "pdtop/data/corpus.txt", "pdtop/themes/pdtop-dark.yaml"} <= needed
    missing = needed - set(zipfile.ZipFile(wheel).namelist())
    assert not missing, f"not in the wheel: {sorted(missing)}"


def test_the_dashboard_starts_from_the_installed_wheel(installed, recording, tmp_path):
    probe = subprocess.run([sys.executable, "-c", "import pdtop, sys; print(pdtop.__file__)"], cwd=tmp_path,
                           env={**os.environ, "PYTHONPATH": str(installed)}, capture_output=True, text=True)
    assert probe.stdout.strip() == str(installed / "pdtop" / "__init__.py")  # not the source tree
    result = _run(installed, ["replay", str(recording)], tmp_path, TEXTUAL_SCREENSHOT="2",
                  TEXTUAL_SCREENSHOT_LOCATION=str(tmp_path), TEXTUAL_SCREENSHOT_FILENAME="shot.svg")
    assert result.returncode == 0, result.stderr[-2000:]
    picture = (tmp_path / "shot.svg").read_text()
    assert "timeline" in picture and "replay" in picture


@pytest.fixture(scope="module")
def broken(installed, tmp_path_factory) -> Path:
    """The installed package without its stylesheet: what every non-editable install was before it was
    in package-data (Textual stops with a StylesheetError)."""
    site = tmp_path_factory.mktemp("broken")
    shutil.copytree(installed, site, dirs_exist_ok=True)
    (site / "pdtop" / "ui" / "app.tcss").unlink()
    return site


@pytest.mark.parametrize("mode", ["replay", "attach", "dashboard"])
def test_a_crashed_dashboard_exits_non_zero(broken, mode, recording, tmp_path):
    args = {"replay": ["replay", str(recording)], "attach": ["attach", "ws://127.0.0.1:9"],
            "dashboard": ["--device", "sim:H100"]}[mode]
    result = _run(broken, args, tmp_path)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "app.tcss" in result.stderr and "stopped on an error" in result.stderr
