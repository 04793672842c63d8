"""The package's layout as docs/architecture.md draws it: data flows one way (commands -> the LSP front
and the engine service -> backends -> the model thread -> the completion pipeline -> engine -> model ->
kernels), so no module imports one of a layer above its own, and no two modules import each other in a
circle; the LSP front imports no backend (the command that starts it hands it the model's loader); the
product never imports the lab (llada_lab), and the lab's training no part of the server; rooms stay
small; every command's entry point lives in commands/; kernels/ holds no engine code (a kernel module
only the engine uses belongs beside it); no two modules of the product share a name. The tests mirror
the packages (tests/<package>/, tests/lab/, tests/project/, tests/e2e/), their basenames unique, and
every test checks something.

Read from the source with `ast` (every import, in functions and under `if TYPE_CHECKING:` too: a circle
a type checker follows is a circle a reader follows); nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "llada_lsp"
PACKAGES = ("llada_lsp", "llada_lab")  # the product and the lab: the imports followed are theirs
# Lower is higher up. A module may import its own layer and any below it.
LAYERS = {
    "cli": 0, "__main__": 0, "commands": 0,
    "training": 1, "lsp_client": 1,  # the tools' LSP client: it holds documents as server/ does
    "server": 2,
    "service": 3,
    "backends": 4,
    "runtime": 5,
    "completion": 6,
    "engine": 7,
    "model": 8,
    "kernels": 9,
    "wire": 10, "address": 10, "errors": 10, "report": 10, "_lazy": 10, "__init__": 10, "kernel_backend": 10,
}  # fmt: skip
SMALL_ROOMS = ("server", "service", "backends", "runtime")
MAX_LINES = 400


def modules(package: str = "llada_lsp") -> dict[str, Path]:
    out = {}
    for path in (ROOT / package).rglob("*.py"):
        parts = path.relative_to(ROOT / package).with_suffix("").parts
        out[".".join((package, *parts))] = path
    return out


def ours(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


def imports(name: str, path: Path) -> set[str]:
    """The modules of PACKAGES `name` imports, in functions and `if TYPE_CHECKING:` blocks too, and
    by name through `importlib.import_module("...")` (`from pkg import x` counts pkg and pkg.x)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def walk(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if ours(alias.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if ours(module):
                found.add(module)
                found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and _import_module(node.func) and node.args:
            named = node.args[0]
            if isinstance(named, ast.Constant) and isinstance(named.value, str) and ours(named.value):
                found.add(named.value)
        for child in ast.iter_child_nodes(node):
            walk(child)

    walk(ast.parse(path.read_text()))
    return found


def _import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id in ("import_module", "__import__"))  # fmt: skip


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1] if len(parts) > 1 else "__init__"]


def test_every_module_has_a_layer():
    """A new top-level module or package is placed in LAYERS, where the rules below can see it."""
    unplaced = sorted({name.split(".")[1] for name in modules() if name != "llada_lsp"} - set(LAYERS))
    assert not unplaced, f"not in LAYERS (tests/project/test_layout.py): {unplaced}"


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
    known = {**modules("llada_lsp"), **modules("llada_lab")}
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


def offending(package: str, under: str, target: str) -> list[str]:
    """`name -> import` for each module of `package` under the folder `under` ("": all of it) that
    imports `target` or a module inside it."""
    return sorted(f"{name} -> {t}" for name, path in modules(package).items()
                  if not under or name.startswith(f"{package}.{under}.")
                  for t in imports(name, path) if t == target or t.startswith(f"{target}."))  # fmt: skip


def test_the_front_imports_no_backend():
    """The model in an LSP front's own process comes from the command that starts it (`Launch.loader`,
    commands/serve.py), so a front for an engine service, or under test, carries no backend."""
    found = offending("llada_lsp", "server", "llada_lsp.backends")
    assert not found, "server/ imports backends/:\n" + "\n".join(found)


def test_the_product_never_imports_the_lab():
    found = offending("llada_lsp", "", "llada_lab")
    assert not found, "llada_lsp imports llada_lab:\n" + "\n".join(found)


def test_training_imports_no_part_of_the_server():
    """Training replays what the server does through the layers below it (completion/history.py,
    completion/next_edit.py), never through the LSP front."""
    where = [(package, "training") for package in PACKAGES if (ROOT / package / "training").is_dir()]
    assert where, "no training package (llada_lsp/training or llada_lab/training): where did it go?"
    found = [line for package, under in where for line in offending(package, under, "llada_lsp.server")]
    assert not found, "training imports the server:\n" + "\n".join(found)


def test_the_rooms_stay_small():
    big = {str(p.relative_to(PACKAGE)): n for room in SMALL_ROOMS for p in (PACKAGE / room).glob("*.py")
           if (n := len(p.read_text().splitlines())) > MAX_LINES}  # fmt: skip
    assert not big, f"files over {MAX_LINES} lines: {big}"
    server = len((PACKAGE / "server" / "language_server.py").read_text().splitlines())
    assert server < 300, f"server/language_server.py has {server} lines: the server's state stays thin"


def test_every_command_entry_point_is_in_commands():
    elsewhere = []
    for name, path in modules().items():
        if ".commands." in name:
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_main"):
                elsewhere.append(f"{name}.{node.name}")
    assert not elsewhere, f"entry points outside commands/: {elsewhere}"


def test_no_engine_code_under_kernels():
    """A module under kernels/ that the engine imports serves the model too (kernels/cpu.py's switch and
    GEMM, the package's `enabled`); one only the engine imports is engine code, filed beside the engine
    (as engine/cpu_step.py is)."""
    known = modules()
    users: dict[str, set[str]] = {name: set() for name in known if name.startswith("llada_lsp.kernels.")}
    for name, path in known.items():
        for target in imports(name, path):
            if target in users and not name.startswith("llada_lsp.kernels"):
                users[target].add(name.split(".")[1])
    engine_only = sorted(name for name, by in users.items() if "engine" in by and "model" not in by)
    assert not engine_only, f"kernel modules only the engine uses (move them to engine/): {engine_only}"


# Module names used twice: none. A pair that must stay (it should not) is listed here, and the test says
# when it is gone. commands/ is left out: its modules are named after their commands.
KNOWN_TWINS: set[str] = set()


def test_no_module_name_is_used_twice():
    names: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if path.name in ("__init__.py", "__main__.py") or rel.parts[0] == "commands":
            continue
        names.setdefault(path.name, []).append(str(rel))
    twice = {name: sorted(where) for name, where in names.items() if len(where) > 1}
    assert not {n: w for n, w in twice.items() if n not in KNOWN_TWINS}, f"module names used twice: {twice}"
    stale = KNOWN_TWINS - set(twice)
    assert not stale, f"no longer twins: remove {sorted(stale)} from KNOWN_TWINS"


# --- the tests' tree ---------------------------------------------------------------------------------------------------
TESTS = ROOT / "tests"
# Beside the packages' folders: the lab's and the benchmarks' tests, the repository's as a whole (this
# file, the wheel), the real editors and the real SGLang; and the data the tests read, which holds none.
TEST_FOLDERS = {"lab", "project", "e2e"}
SUPPORT_FOLDERS = {"data", "fakes", "golden", "hooks"}


def test_the_tests_mirror_the_packages():
    """A module's tests are found by its name: those of llada_lsp/<package>/<module>.py are
    tests/<package>/test_<module>*.py, so each folder of tests/ is a product package, lab, project or
    e2e (or one of the data folders, which hold no test), and no test lives in tests/ itself."""
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    stray = sorted(folders - packages - TEST_FOLDERS - SUPPORT_FOLDERS)
    assert not stray, f"tests/ folders that are no package of llada_lsp, lab, project or e2e: {stray}"
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not loose, f"tests directly in tests/ (file them under the package they check): {loose}"
    in_data = sorted(str(p.relative_to(TESTS)) for f in SUPPORT_FOLDERS for p in (TESTS / f).rglob("test_*.py"))
    assert not in_data, f"tests in the data folders: {in_data}"


def test_test_module_names_are_unique():
    """pytest imports each test module by its basename (the default import mode, no __init__.py), and
    conftest.py puts every test folder on sys.path: two files of one name would shadow each other."""
    names: dict[str, list[str]] = {}
    for path in TESTS.rglob("*.py"):
        rel = path.relative_to(TESTS)
        if rel.parts[0] != "golden" and "node_modules" not in rel.parts:
            names.setdefault(path.name, []).append(str(rel))
    twice = {name: sorted(where) for name, where in names.items() if len(where) > 1}
    assert not twice, f"module names used twice under tests/: {twice}"


CHECKS = {"raises", "warns", "fail", "deprecated_call"}  # pytest's, besides `assert`


def _checks(function: ast.AST) -> bool:
    """An `assert`, a `raise`, `pytest.raises` and its kin, or a mock's `assert_*`."""
    for node in ast.walk(function):
        if isinstance(node, ast.Assert | ast.Raise):
            return True
        if isinstance(node, ast.Attribute) and (
            node.attr.startswith("assert_") or (node.attr in CHECKS and getattr(node.value, "id", "") == "pytest")
        ):
            return True
    return False


def _called(function: ast.AST) -> set[str]:
    return {node.func.id if isinstance(node.func, ast.Name) else node.func.attr for node in ast.walk(function)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute)}  # fmt: skip


def test_every_test_checks_something():
    """A test that asserts nothing passes by not raising, and says nothing of what it checks: each test
    asserts (or expects an exception), or calls a helper of tests/ that does (by name, transitively)."""
    trees = {path: ast.parse(path.read_text()) for path in TESTS.rglob("*.py")
             if "golden" not in path.relative_to(TESTS).parts and "node_modules" not in path.parts}  # fmt: skip
    functions: dict[str, list[ast.AST]] = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions.setdefault(node.name, []).append(node)
    checking = {name for name, defs in functions.items() if any(_checks(d) for d in defs)}
    while more := {name for name, defs in functions.items()
                   if name not in checking and any(_called(d) & checking for d in defs)}:  # fmt: skip
        checking |= more
    silent = [f"{path.relative_to(TESTS)}:{node.lineno} {node.name}" for path, tree in trees.items()
              if path.name.startswith("test_") for node in ast.walk(tree)
              if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
              and not _checks(node) and not _called(node) & checking]  # fmt: skip
    assert not silent, "tests that check nothing:\n" + "\n".join(silent)
