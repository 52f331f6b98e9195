"""The layers of the package, read from its imports: no circle between modules (type hints included), and every
import between two rooms goes down the floors declared here. A room is a folder of the package, or one file of it;
inside ``core/`` each file is a room, ``core/trl/`` (TRL's edge) one. A new room must be given its floor."""

import pytest
from _support.import_graph import import_cycle, import_graph


# Floors of the package, from the ground up: a room imports only rooms of its own floor or below.
PACKAGE_FLOORS = [
    {"kernels", "_folder_cache", "rewards"},
    {"core"},
    {"methods", "evaluation", "pretrained"},
    {"report", "toy", "__init__"},
    {"demo"},
    {"scripts", "cli"},
]
# Floors inside core/: the leaves, TRL's edge with the scoring head and the controllers, the config and the seams, what
# stands on the config (schedules' bounds, checkpoints), the trainer.
CORE_FLOORS = [
    {"warn", "batch", "statistics", "places", "schedules", "multimodal", "data", "weights", "__init__"},
    {"trl", "head", "control"},
    {"config", "parts", "citation"},
    {"bounds", "checkpoint"},
    {"trainer"},
]


def room(module: str, depth: int) -> str:
    """The room of ``module`` among the rooms ``depth`` names deep (``trl_entropy.core.trl.bridge`` at 2: ``core``;
    at 3, inside core: ``trl``); a package's own ``__init__`` is the room ``__init__``."""
    parts = module.split(".")
    return parts[depth] if len(parts) > depth else "__init__"


def floor_of(name: str, floors: list[set[str]]) -> int:
    found = [number for number, rooms in enumerate(floors) if name in rooms]
    assert found, f"the room {name!r} has no floor: add it to the floors of test_layering.py"
    return found[0]


def arrows_up(graph: dict[str, set[str]], inside: str, depth: int, floors: list[set[str]]) -> list[str]:
    """The imports between two rooms under ``inside`` that go up the floors, as ``importer -> imported``."""
    offenders = []
    for module, imports in sorted(graph.items()):
        if not module.startswith(inside):
            continue
        for imported in sorted(imports):
            if not imported.startswith(inside):
                continue
            here, there = room(module, depth), room(imported, depth)
            if here != there and floor_of(there, floors) > floor_of(here, floors):
                offenders.append(f"{module} -> {imported}")
    return offenders


def test_the_helpers_find_circles_and_arrows_up():
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    graph = {"p.core.trainer": {"p.core.batch"}, "p.core.batch": {"p.core.trainer"}}
    assert arrows_up(graph, "p.core", 2, [{"batch"}, {"trainer"}]) == ["p.core.batch -> p.core.trainer"]
    graph = import_graph()
    assert "trl_entropy.core.trl.bridge" in graph["trl_entropy.core.trainer"]
    assert "trl_entropy.core.trl.bridge" in graph["trl_entropy.evaluation.passk"]
    assert "trl_entropy.evaluation.entropy_law" in graph["trl_entropy.report"]  # a function-level import


def test_the_package_has_no_import_circle():
    assert import_cycle(import_graph()) is None


@pytest.mark.parametrize(
    ("inside", "depth", "floors"),
    [("trl_entropy", 1, PACKAGE_FLOORS), ("trl_entropy.core", 2, CORE_FLOORS)],
    ids=["package", "core"],
)
def test_every_import_between_rooms_goes_down(inside, depth, floors):
    assert arrows_up(import_graph(), inside, depth, floors) == []


def test_trls_edge_stands_on_the_leaves_only():
    """core/trl/ adapts TRL: it imports nothing of core/ but the leaves, so the trainer, the checkpoints and the
    config stand on it and it never reaches back for their state."""
    graph = import_graph()
    used = {
        room(imported, 2)
        for module, imports in graph.items()
        if module.startswith("trl_entropy.core.trl")
        for imported in imports
        if imported.startswith("trl_entropy.core") and not imported.startswith("trl_entropy.core.trl")
    }
    assert used <= CORE_FLOORS[0], sorted(used - CORE_FLOORS[0])


def test_nothing_in_core_imports_a_method():
    """The core runs whatever parts a config names: it never reaches for a method (or the registry) itself."""
    offenders = {
        module: sorted(imported for imported in imports if imported.startswith("trl_entropy.methods"))
        for module, imports in import_graph().items()
        if module.startswith("trl_entropy.core")
    }
    assert {module: imports for module, imports in offenders.items() if imports} == {}
