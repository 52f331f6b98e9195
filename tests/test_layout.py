"""The layout's rules, read from the source so that they hold after every change: one file per method, each reading
math → controller → config → trainer; methods never override TRL's or Trainer's private methods nor import each
other; the base stays small; nothing cites a file outside the repository."""

import ast
import subprocess
from pathlib import Path

import pytest
from transformers import Trainer
from trl import GRPOTrainer

from trl_entropy.core.control import Controller
from trl_entropy.core.trainer import EntropyGRPOTrainer
from trl_entropy.methods import METHODS, SPECS


ROOT = Path(__file__).resolve().parents[1]
METHODS_DIR = ROOT / "trl_entropy" / "methods"
# Every file of the methods package but the registry and the declarations' vocabulary (spec.py).
METHOD_FILES = sorted(path for path in METHODS_DIR.glob("*.py") if path.name not in {"__init__.py", "spec.py"})
# The registered methods' own modules (cov_selection.py is machinery Clip-Cov and KL-Cov share, not a method).
METHOD_MODULES = sorted({m.trainer_class.__module__ for m in METHODS.values()} - {EntropyGRPOTrainer.__module__})


def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def test_every_registered_method_has_its_own_file():
    assert METHOD_MODULES == sorted(spec.trainer_class.__module__ for spec in SPECS[1:])  # GRPO: the base's own
    assert {f"trl_entropy.methods.{path.stem}" for path in METHOD_FILES} >= set(METHOD_MODULES)


def private_overrides(module: ast.Module) -> list[str]:
    """``Class.method`` for every method defined in ``module`` that overrides a private method of TRL or Trainer."""
    return [
        f"{node.name}.{item.name}"
        for node in ast.walk(module)
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, ast.FunctionDef) and item.name.startswith("_") and not item.name.endswith("__")
        if hasattr(GRPOTrainer, item.name) or hasattr(Trainer, item.name)
    ]


def test_private_overrides_are_found():
    """The check below sees an override (a broken check would pass everything)."""
    planted = ast.parse("class T:\n    def _compute_loss(self, model, inputs):\n        pass\n")
    assert private_overrides(planted) == ["T._compute_loss"]


@pytest.mark.parametrize("path", METHOD_FILES, ids=lambda p: p.name)
def test_methods_define_no_private_method_of_trl_or_trainer(path):
    """What a method needs from TRL's internals is a hook of the base, never an override of its private methods."""
    assert private_overrides(tree(path)) == []


@pytest.mark.parametrize("path", METHOD_FILES, ids=lambda p: p.name)
def test_no_method_imports_another_method(path):
    others = {module for module in METHOD_MODULES if module != f"trl_entropy.methods.{path.stem}"}
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            absolute = f"trl_entropy.methods.{module}" if node.level == 1 else module
            assert absolute not in others, f"{path.name} imports the method {absolute}"
            siblings = {f"trl_entropy.methods.{alias.name}" for alias in node.names}
            assert not (node.level == 1 and not module and others & siblings)


def section(node: ast.stmt) -> int | None:
    """0 math, 1 controller, 2 config, 3 trainer; None for constants and imports."""
    if isinstance(node, ast.FunctionDef):
        return 0
    if isinstance(node, ast.ClassDef):
        bases = {getattr(base, "id", getattr(base, "attr", "")) for base in node.bases}
        if node.name.endswith("Config"):
            return 2
        if node.name.endswith("Trainer"):
            return 3
        if any(name.endswith("Controller") or name == Controller.__name__ for name in bases):
            return 1
        raise AssertionError(f"class {node.name} fits no section")
    return None


@pytest.mark.parametrize("path", METHOD_FILES, ids=lambda p: p.name)
def test_each_method_file_reads_math_controller_config_trainer(path):
    sections = [s for s in (section(node) for node in tree(path).body) if s is not None]
    assert sections == sorted(sections), f"{path.name} is out of order: {sections}"
    assert 3 in sections, f"{path.name} has no trainer"


@pytest.mark.parametrize(
    ("path", "limit"),
    [(ROOT / "trl_entropy" / "core" / "trainer.py", 350)] + [(path, 250) for path in METHOD_FILES],
    ids=lambda value: value.name if isinstance(value, Path) else str(value),
)
def test_files_stay_small(path, limit):
    assert len(path.read_text().splitlines()) < limit


def test_nothing_cites_a_file_outside_the_repository():
    """Users have the repository only: cite the paper (title, arXiv id, equation) and the method's page under docs/."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    # Spelled in pieces so that this file does not name them itself.
    outside = ["".join(parts) for parts in [("..", "/shared"), ("shared", "/seeds"), ("SPEC", ".md"), ("SPEC", " v")]]
    offenders = []
    for name in files:
        path = ROOT / name
        if path.suffix in {".png", ".pt", ".whl"} or not path.is_file():
            continue
        text = path.read_text(errors="ignore")
        offenders += [f"{name}: {marker}" for marker in outside if marker in text]
    assert offenders == []


def test_the_adding_a_method_example_follows_the_rules():
    """docs/adding_a_method.md's example (trained by tests/test_docs.py) reads as a method file must."""
    page = (ROOT / "docs" / "adding_a_method.md").read_text()
    (example,) = [block for block in page.split("```python\n")[1:]]
    nodes = ast.parse(example.split("```")[0]).body
    sections = [s for s in (section(node) for node in nodes) if s is not None]
    assert sections == [0, 1, 2, 3]
    assert private_overrides(ast.Module(body=nodes, type_ignores=[])) == []
