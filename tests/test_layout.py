"""The package's layout as docs/architecture.md draws it: data flows one way (commands -> the LSP front
and the engine service -> backends -> the model thread -> the completion pipeline -> engine -> model ->
kernels), so no module imports one of a layer above its own, and no two modules import each other in a
circle; rooms stay small; every command's entry point lives in commands/.

Read from the source with `ast` (every import, in functions too); nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "llada_lsp"
# Lower is higher up. A module may import its own layer and any below it.
LAYERS = {
    "cli": 0, "__main__": 0, "commands": 0,
    "training": 1,
    "server": 2,
    "service": 3,
    "backends": 4,
    "runtime": 5,
    "completion": 6,
    "engine": 7,
    "model": 8,
    "kernels": 9,
    "wire": 10, "address": 10, "errors": 10, "_lazy": 10, "__init__": 10,
}  # fmt: skip
SMALL_ROOMS = ("server", "service", "backends", "runtime")
MAX_LINES = 400


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        out[".".join(("llada_lsp", *parts))] = path
    return out


def imports(name: str, path: Path) -> set[str]:
    """The llada_lsp modules `name` imports when it runs, in functions too (`if TYPE_CHECKING:` blocks
    are for type checkers and are left out; `from pkg import x` counts pkg and pkg.x)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def walk(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("llada_lsp"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.startswith("llada_lsp"):
                found.add(module)
                found.update(f"{module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            walk(child)

    walk(ast.parse(path.read_text()))
    return found


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1] if len(parts) > 1 else "__init__"]


def test_no_import_points_up_a_layer():
    known = modules()
    upward = []
    for name, path in known.items():
        if name == "llada_lsp" or name.endswith(".__init__"):
            continue  # a package's face: its lazy names point at what it fronts
        for target in imports(name, path):
            if target in known and layer(target) < layer(name):
                upward.append(f"{name} -> {target}")
    assert not upward, "imports that point up a layer:\n" + "\n".join(sorted(upward))


def test_no_import_circle():
    known = modules()
    graph = {name: {t for t in imports(name, path) if t in known and t != name}
             for name, path in known.items()}  # fmt: skip
    seen, stack, circles = set(), [], []

    def visit(node: str) -> None:
        if node in stack:
            circles.append(" -> ".join(stack[stack.index(node) :] + [node]))
            return
        if node in seen:
            return
        seen.add(node)
        stack.append(node)
        for target in sorted(graph[node]):
            visit(target)
        stack.pop()

    for name in sorted(graph):
        visit(name)
    packages = {n for n, p in known.items() if p.name == "__init__.py"}
    circles = [c for c in circles if not any(part in packages for part in c.split(" -> "))]
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_rooms_stay_small():
    big = {str(p.relative_to(PACKAGE)): n for room in SMALL_ROOMS for p in (PACKAGE / room).glob("*.py")
           if (n := len(p.read_text().splitlines())) > MAX_LINES}  # fmt: skip
    assert not big, f"files over {MAX_LINES} lines: {big}"


def test_every_command_entry_point_is_in_commands():
    elsewhere = []
    for name, path in modules().items():
        if ".commands." in name:
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_main"):
                elsewhere.append(f"{name}.{node.name}")
    assert not elsewhere, f"entry points outside commands/: {elsewhere}"
