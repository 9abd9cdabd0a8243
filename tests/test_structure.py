"""The package's shape: no import circle, each control command named in one module, each module
stating its one job, a dashboard without torch."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pdtop
from pdtop.engine.scheduling.commands import ENGINE_COMMANDS
from pdtop.telemetry.server.commands import SERVER_COMMANDS

PACKAGE = Path(pdtop.__file__).parent
LONG = 500  # past this many lines a module says why it is still one job
WHY_ONE_JOB = "One job:"  # the paragraph of a long module's docstring that says why


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every pdtop module `name` imports when it runs, anywhere in its file (function-local too).
    Imports under `if TYPE_CHECKING:` are left out, as import-linter's `exclude_type_checking_imports`
    does: they never run, so they make no circle, and they let a module name its real types."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m in modules and m != name}


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of `tree` but those inside the body of an `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`)."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def test_no_import_circle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            raise AssertionError("import circle: " + " -> ".join([*trail[trail.index(name):], name]))
        if name in done:
            return
        for other in sorted(graph[name]):
            visit(other, [*trail, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_the_walk_finds_a_circle_when_there_is_one(tmp_path):
    """The check above can fail: two modules that import each other are found, under an `if` or in a
    function too, and only a `TYPE_CHECKING` import is left out (the `else` of one still runs)."""
    (tmp_path / "a.py").write_text("from pdtop.b import x\n")
    (tmp_path / "b.py").write_text("if True:\n    from pdtop.a import y\n")
    (tmp_path / "c.py").write_text("def f():\n    import pdtop.a\n")
    (tmp_path / "d.py").write_text("from typing import TYPE_CHECKING\nimport typing\nif TYPE_CHECKING:\n"
                                   "    from pdtop.a import y\nelse:\n    from pdtop.b import x\n"
                                   "if typing.TYPE_CHECKING:\n    import pdtop.c\n")
    modules = {f"pdtop.{m}": tmp_path / f"{m}.py" for m in "abcd"}
    assert _imports("pdtop.a", modules["pdtop.a"], modules) == {"pdtop.b"}
    assert _imports("pdtop.b", modules["pdtop.b"], modules) == {"pdtop.a"}
    assert _imports("pdtop.c", modules["pdtop.c"], modules) == {"pdtop.a"}
    assert _imports("pdtop.d", modules["pdtop.d"], modules) == {"pdtop.b"}


def test_each_command_name_is_spelled_in_one_module():
    """A command's wire name is a string in its own class only; everything else uses the class."""
    names = [*ENGINE_COMMANDS, *SERVER_COMMANDS]
    for name in names:
        if name in ("set", "inject", "auth"):  # also ordinary words and field names elsewhere
            continue
        spelled = [p for p in PACKAGE.rglob("*.py") if re.search(rf"[\"']{name}[\"']", p.read_text())]
        assert len(spelled) == 1, f"{name!r} is spelled in {[str(p.relative_to(PACKAGE)) for p in spelled]}"


def _undocumented(paths: list[Path]) -> dict[str, str]:
    """Modules with code that do not open with their job, and long ones that do not say why they are one."""
    out = {}
    for p in paths:
        text = p.read_text()
        if not text.strip() or p.name == "__main__.py":
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if not doc.strip():
            out[p.name] = "no docstring stating its job"
        elif len(text.splitlines()) > LONG and WHY_ONE_JOB not in doc:
            out[p.name] = f"over {LONG} lines and no {WHY_ONE_JOB!r} paragraph"
    return out


def test_every_module_states_its_job_and_a_long_one_says_why_it_is_one():
    """A review signal in place of a line limit: size follows the job (DESIGN.md)."""
    bad = _undocumented(sorted(PACKAGE.rglob("*.py")))
    assert not bad, bad


def test_the_job_check_can_fail(tmp_path):
    (tmp_path / "bare.py").write_text("x = 1\n")
    (tmp_path / "long.py").write_text('"""A long module."""\n' + "x = 1\n" * LONG)
    (tmp_path / "why.py").write_text(f'"""A long module.\n\n{WHY_ONE_JOB} it is.\n"""\n' + "x = 1\n" * LONG)
    assert set(_undocumented(sorted(tmp_path.iterdir()))) == {"bare.py", "long.py"}


def test_the_dashboard_loads_no_torch():
    """The ui takes the engine's vocabulary (records, commands, knobs, policy names) and `pdtop.tune`'s
    search, score and report, never the model: attaching to a remote server must not load torch."""
    code = ("import sys, pdtop.ui.app, pdtop.ui.live_tune, pdtop.ui.screens.tune, pdtop.commands.attach\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
