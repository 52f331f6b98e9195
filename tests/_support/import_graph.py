"""The package's import graph, read from the source: every ``import`` of one of its modules, at module level, inside a
function or under ``if TYPE_CHECKING:`` (a function-level import only delays a circle to its first call, and a type
hint ties two modules as much as a call does)."""

import ast
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
PACKAGE_FILES = sorted((ROOT / "trl_entropy").rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``path`` imports; ``from package import name`` counts as an import of the
    module ``package.name`` when that is a module."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                source = node.module
            else:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = ".".join(filter(None, [base, node.module]))
            for alias in node.names:
                found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source)
    return found & modules


def import_graph() -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports."""
    modules = {module_name(path): path for path in PACKAGE_FILES}
    return {name: imported_modules(path, set(modules)) - {name} for name, path in modules.items()}


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` (``[a, b, …, a]``), or None (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the path, "done" once every descendant is explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for child in sorted(graph.get(node, ())):
            if state.get(child) == "open":
                return path[path.index(child) :] + [child]
            if child not in state and (cycle := visit(child)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    return next((cycle for node in sorted(graph) if node not in state and (cycle := visit(node))), None)
