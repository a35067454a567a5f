"""The architecture, checked: import-linter layers, no import cycle, module and function sizes."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ragwarm", "schemas", "rag", "streams", "workers")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
# Modules allowed past the cap, each by name, with its own ceiling and the reason it is one
# module: a file is split where it holds two jobs, never to get under a number.
LONG_MODULES: dict[str, tuple[int, str]] = {
    "workers/kv/cache.py": (
        550,
        "PrefixCache is one job (admit, look up, invalidate, evict over the block pool); its "
        "pure helpers already live in workers/kv/entries.py",
    ),
    "schemas/events.py": (
        600,
        "the wire models, one per event type and version, each read by codec's one "
        "registry; versions subclass each other, so a version's fields sit beside its base's",
    ),
}


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_import_linter_contracts_are_kept() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "import-linter is part of the test extras"
    run = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


def _cycle(graph: grimp.ImportGraph) -> list[str] | None:
    """One import cycle between modules, or None (iterative DFS, colours white/grey/black)."""
    state: dict[str, int] = {}
    for start in sorted(graph.modules):
        if state.get(start):
            continue
        stack = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        path = [start]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
    return None


def test_no_import_cycle() -> None:
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False)
    # TYPE_CHECKING-only imports are not cycles at run time; grimp cannot tell, so the
    # graph is built from every import and must be acyclic all the same.
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_size(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    cap, _reason = LONG_MODULES.get(str(path.relative_to(ROOT)), (MAX_MODULE_LINES, ""))
    assert lines <= cap, f"{lines} lines: split it by what its parts are"


def test_named_long_modules_exist_and_need_their_exception() -> None:
    for name, (_cap, reason) in LONG_MODULES.items():
        path = ROOT / name
        assert path.exists(), f"{name}: a named exception for a module that is gone"
        assert reason, f"{name}: an exception needs its reason"
        assert len(path.read_text().splitlines()) > MAX_MODULE_LINES, f"{name} fits the cap now"


def test_function_sizes() -> None:
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {size}")
    assert not long, "functions over 60 lines:\n" + "\n".join(long)


# The benchmarks' own tests; every other test reaches the simulation harness through
# `streams.sim` and `workers.sim`, so the product's tests never depend on the benchmarks.
BENCH_TESTS = ("test_bench_*.py",)


def _imports_bench(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        if any(n == "ragwarm.bench" or n.startswith("ragwarm.bench.") for n in names):
            lines.append(node.lineno)
    return lines


def test_product_tests_do_not_import_the_benchmarks() -> None:
    tests = ROOT / "tests"
    bench = {p for pattern in BENCH_TESTS for p in tests.rglob(pattern)}
    found = [f"{p.relative_to(ROOT)}:{n}" for p in sorted(tests.rglob("*.py")) if p not in bench
             for n in _imports_bench(p)]
    assert not found, "product tests importing ragwarm.bench:\n" + "\n".join(found)


def _imports_a_test_module(path: Path) -> list[int]:
    """Lines of `path` importing a test module (`test_*`): helpers shared by tests live in
    kits (conftest.py, *_kit.py, *_fakes.py, *_proc.py), so no test depends on another."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            # `from .test_x import` or `from tests.unit.test_x import`
            names = [node.module or ""] if node.level or (node.module or "").startswith(
                "tests.") else []
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if alias.name.startswith("tests.")]
        else:
            continue
        if any(part.startswith("test_") for n in names for part in n.split(".")):
            lines.append(node.lineno)
    return lines


def test_no_test_module_imports_another() -> None:
    tests = ROOT / "tests"
    found = [f"{p.relative_to(ROOT)}:{n}" for p in sorted(tests.rglob("*.py"))
             for n in _imports_a_test_module(p)]
    assert not found, "imports of a test module:\n" + "\n".join(found)
