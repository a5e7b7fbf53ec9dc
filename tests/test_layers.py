"""The layer order of docs/architecture.md, enforced: every import of an xtrain module (at the top,
inside a function, under ``TYPE_CHECKING``) points at the same layer or one below, and no modules
import each other in a circle (inside a folder too). Read with ``ast``: nothing is imported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
XTRAIN = REPO / "xtrain"
# bottom to top, as docs/architecture.md draws them: a name is a top-level module or folder of xtrain/
LAYERS = (
    ("errors", "shell", "atomic", "console", "encoding", "structured"),
    ("builtin",),
    ("machine",),
    ("config",),
    ("planning",),
    ("runtime",),
    ("launch",),
    ("data",),
    ("model",),
    ("tasks",),
    ("evaluate",),
    ("train",),
    ("trained", "predict", "run"),
    ("export",),
    ("bench",),
    ("report",),
    ("commands",),
    ("studio",),
    ("cli", "__main__"),
)
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(XTRAIN.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The xtrain modules ``name`` imports anywhere in its file: ``from P import m`` is module
    ``P.m`` where that is a module, else ``P``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("xtrain.")}
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("xtrain"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in MODULES else node.module)
    return {m for m in out if m != name and m != "xtrain"}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(module: str) -> int:
    return LAYER[module.split(".")[1]]


def test_every_module_has_a_layer() -> None:
    homeless = {m.split(".")[1] for m in MODULES if m != "xtrain"} - set(LAYER)
    assert not homeless, f"add these to LAYERS and to docs/architecture.md: {sorted(homeless)}"


def test_imports_point_down_the_layers() -> None:
    upward = sorted(
        f"{m} -> {t}"
        for m, targets in GRAPH.items()
        if m != "xtrain"
        for t in targets
        if _layer(t) > _layer(m)
    )
    assert not upward, "imports that run back up the layers:\n" + "\n".join(upward)


def test_no_module_imports_in_a_circle() -> None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for t in sorted(GRAPH.get(m, ())):
            if state.get(t) == 1:
                return path[path.index(t) :] + [t]
            if t not in state and (found := visit(t)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(GRAPH):
        if m not in state and (circle := visit(m)):
            raise AssertionError("modules that import each other: " + " -> ".join(circle))


def test_the_documented_order_is_this_one() -> None:
    """docs/architecture.md states the order in one line; it must be the one enforced here."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    line = re.search(r"^Layers, bottom to top: (.+)$", text, re.MULTILINE)
    assert line, "docs/architecture.md: the 'Layers, bottom to top:' line"
    steps = line.group(1).rstrip(".").split(" -> ")
    documented = [tuple(n.strip("` ").removesuffix("/") for n in step.split(" / ")) for step in steps]
    assert documented == list(LAYERS)


MODULE_LINES, FUNCTION_LINES = 420, 80  # "about 400" and "about 80" (docs/architecture.md)


def _says_why(lines: list[str]) -> bool:
    return any(ln.lstrip().startswith("#") and "longer:" in ln for ln in lines)


def test_long_modules_and_functions_say_why() -> None:
    """A module over about 400 lines says why on its first lines, a function over about 80 in
    the comment above it or on its first lines, in a comment that starts with ``longer:``."""
    silent = []
    for name, path in MODULES.items():
        lines = path.read_text(encoding="utf-8").splitlines()
        if len(lines) > MODULE_LINES and not _says_why(lines[:5]):
            silent.append(f"{name}: {len(lines)} lines")
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            around = lines[max(0, first - 4) : first - 1] + lines[node.lineno : node.lineno + 3]
            if size > FUNCTION_LINES and not _says_why(around):
                silent.append(f"{name}.{node.name}: {size} lines")
    assert not silent, "say why (a `# longer:` comment) or split:\n" + "\n".join(silent)
