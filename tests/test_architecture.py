"""The package's structure holds what docs/architecture.md promises.

* no import cycle between h5batch's modules, counting every import statement
  (function-level "late" imports and ``if TYPE_CHECKING:`` blocks included: a cycle that
  only type checking sees still ties the modules together; shared types go to a module
  both sides import, as :mod:`h5batch.config_types`);
* no product function takes a fault-injection parameter (faults come through the one
  opt-in hook, :mod:`h5batch.faults`);
* no product module over about 450 lines, unless its docstring gives the reason (``Size:``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PACKAGE = REPO / "h5batch"
MAX_LINES = 460  # "about 450"
FAULTY = re.compile(r"(^|_)faults?($|_)|^pause_at$")  # faults, fault_pause, pause_at, ...


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """h5batch modules that ``path`` imports, anywhere in it (``if TYPE_CHECKING:`` too)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()

    def resolve(mod: str | None, level: int) -> str:
        if level == 0:
            return mod or ""
        base = package.split(".")
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([mod] if mod else []))

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for a in child.names:
                    if a.name in modules:
                        found.add(a.name)
            elif isinstance(child, ast.ImportFrom):
                target = resolve(child.module, child.level)
                for a in child.names:
                    sub = f"{target}.{a.name}"
                    if sub in modules:
                        found.add(sub)  # "from . import faults": the module itself
                    elif target in modules:
                        found.add(target)
            visit(child)

    visit(ast.parse(path.read_text()))
    found.discard(name)
    return found


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(files)
    return {name: _imports(path, modules) for name, path in files.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_the_checker_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_late_and_type_checking_imports_included():
    graph = _graph()
    assert len(graph) > 30  # the walk found the package
    assert "h5batch.errors" in graph["h5batch.conversion.cluster"]
    assert "h5batch.config_types" in graph["h5batch.layouts.base"]  # under TYPE_CHECKING
    assert _cycles(graph) == []


def test_no_fault_parameter_in_a_product_signature():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                    if FAULTY.search(arg.arg):
                        offenders.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}({arg.arg})")
            if isinstance(node, ast.ClassDef):  # dataclass fields are signatures too
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and FAULTY.search(
                            item.target.id):
                        offenders.append(f"{path.relative_to(REPO)}:{item.lineno} {node.name}.{item.target.id}")
    assert offenders == []


def test_product_modules_are_small_or_say_why():
    big = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        n = text.count("\n")
        doc = ast.get_docstring(ast.parse(text)) or ""
        if n > MAX_LINES and "Size:" not in doc:
            big.append(f"{path.relative_to(REPO)}: {n} lines")
    assert big == []
