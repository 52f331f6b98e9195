"""docs/adding_a_method.md is true: its list of the loss step's steps is the code's, and its walk-through method,
shipped into a copy of the package and its docs by the page's own "Shipping it" steps, is registered, written into the
docs' lists of methods by the page's command, parsed from the command line and trained combined with a method of
another axis."""

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from _support.grpo import TOY_CACHE

from trl_entropy.core.trainer import EntropyGRPOTrainer
from trl_entropy.methods import METHODS, Place


# A method of the advantages' axis, one name (no variant): the walk-through's method trains beside it.
OTHER = next(spec for spec in METHODS.values() if spec.acts_on[:1] == (Place.ADVANTAGES,) and not spec.defaults)


ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "adding_a_method.md"
STEP = re.compile(r"^\s*(\d+)\.\s+(.+?)\s*$")


def code_steps() -> list[tuple[int, str]]:
    """The numbered comments of ``EntropyGRPOTrainer.loss_step``: ``# N. name`` at the end of its lines."""
    source = inspect.getsource(EntropyGRPOTrainer.loss_step)
    return [(int(number), name) for number, name in re.findall(r"#\s*(\d+)\.\s*([^\n]+?)\s*$", source, re.MULTILINE)]


def page_steps(page: str) -> list[tuple[int, str]]:
    """The numbered list of the page's section on the loss step (its first ```text block)."""
    section = page.split("## The loss step and its seams", 1)[1]
    block = section.split("```text\n", 1)[1].split("```", 1)[0]
    return [(int(match[1]), match[2]) for match in map(STEP.match, block.splitlines()) if match]


def test_the_pages_loss_step_is_the_codes():
    steps = code_steps()
    assert [number for number, _ in steps] == list(range(1, len(steps) + 1)), steps  # one sequence, no gap
    assert page_steps(PAGE.read_text()) == steps


def walk_through_module(page: str) -> str:
    """What the walk-through says ``trl_entropy/methods/floor.py`` holds: its block, before "6. Using it"."""
    block = page.split("## Walk-through: a method in one file", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    module, using = block.split("# 6. Using it.", 1)
    assert "SPEC = MethodSpec(" in module and "trainer.train()" in using
    return module


def ship_into(package: Path, page: str, name: str) -> None:
    """Follow the page's step 2 for the method ``name``: the registry's import line, and its name in ``SPECS``."""
    step = page.split("2. **The registry**", 1)[1].split("\n3. ", 1)[0]
    (import_line,) = re.findall(r"`(from \.<name> import SPEC as _<name>)`", step)
    (entry,) = re.findall(r"`(_<name>)` in `SPECS`", step)
    registry = package / "methods" / "registry.py"
    text = registry.read_text()
    imports = re.findall(r"^from \.\w+ import SPEC as _\w+$", text, re.MULTILINE)
    assert imports, "the registry imports no declaration as the page says"
    text = text.replace(imports[-1], f"{imports[-1]}\n{import_line.replace('<name>', name)}", 1)
    specs = re.search(r"^SPECS: [^\n]*= \(\n(.*?)^\)", text, re.MULTILINE | re.DOTALL)
    assert specs, "the registry has no SPECS tuple as the page says"
    text = text[: specs.end(1)] + f"    {entry.replace('<name>', name)},\n" + text[specs.end(1) :]
    registry.write_text(text)


def docs_command(page: str) -> list[str]:
    """The arguments of the command "Shipping it" runs to write the method into the docs' lists."""
    step = page.split("## Shipping it", 1)[1]
    (arguments,) = re.findall(r"`python docs/tables\.py (--\w+)`: it writes", step)
    return [arguments]


def ship_docs_into(root: Path, page: str, name: str) -> None:
    """Follow the page's step 5 for the method ``name`` in a copy of README.md and docs/: its page, with its section on
    loss types."""
    shutil.copytree(ROOT / "docs", root / "docs", ignore=shutil.ignore_patterns("*.png", "__pycache__"))
    shutil.copy(ROOT / "README.md", root / "README.md")
    (root / "docs" / f"{name}.md").write_text(f"# {name}\n\n## Loss types\n\nEvery loss type.\n")


# Run in the copy, after the generator's command (as "Shipping it" runs it, in a process of its own) wrote the method
# into every list and into EntropyGRPOConfig's file: the method is registered and public, --method names it alone and
# combined, and a combination with a method of another axis (OTHER, a method of the advantages' axis) trains, each
# method logging its own metric.
SCRIPT = """
import json, sys
import trl_entropy
from trl_entropy.methods import FIELD_OWNERS, METHODS, combination
from trl_entropy.scripts.train_arguments import parse_arguments
from trl_entropy.toy import build_toy_dataset, build_toy_policy, toy_reward

_, toy_cache, output_dir, other = sys.argv
assert trl_entropy.__file__.startswith(sys.path[0]), trl_entropy.__file__
floor = METHODS["floor"]
assert floor.trainer_class is trl_entropy.EntropyFloorTrainer and FIELD_OWNERS["floor_gain"] == ["floor"]
_, script_args, training_args, _ = parse_arguments(
    ["--method", f"floor+{other}", "--floor_gain", "0.02", "--output_dir", output_dir, "--use_cpu", "--bf16", "False"]
)
assert (script_args.method, training_args.floor_gain) == (f"floor+{other}", 0.02)
config = trl_entropy.EntropyGRPOConfig(
    entropy_control=["floor", other],
    floor_entropy=5.0,
    output_dir=output_dir,
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=8,
    max_steps=2,
    logging_steps=1,
    report_to=[],
    use_cpu=True,
    bf16=False,
)
assert type(config) is combination(["floor", other]).config_class
model, tokenizer = build_toy_policy(seed=0, cache_dir=toy_cache)
trainer = trl_entropy.EntropyGRPOTrainer(
    model=model,
    processing_class=tokenizer,
    reward_funcs=toy_reward,
    args=config,
    train_dataset=build_toy_dataset(32, seed=0),
)
trainer.train()
logged = {key for entry in trainer.state.log_history for key in entry}
print(json.dumps({
    "parts": [part.key for part in trainer.parts],
    "coef": trainer.controllers["floor"].value,
    "logged": sorted(key for key in logged if key.startswith(("floor/", f"{other}/"))),
}))
"""


def test_the_walk_through_method_ships_by_the_pages_steps_and_trains_combined(tmp_path):
    page = PAGE.read_text()
    copy = tmp_path / "trl_entropy"
    shutil.copytree(ROOT / "trl_entropy", copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "methods" / "floor.py").write_text(walk_through_module(page))
    ship_into(copy, page, "floor")
    ship_docs_into(tmp_path, page, "floor")
    environment = {**os.environ, "PYTHONPATH": str(tmp_path)}

    def run(*arguments):
        return subprocess.run(arguments, cwd=tmp_path, env=environment, capture_output=True, text=True)

    generator = [sys.executable, "docs/tables.py"]  # the copy's
    before, write, after = run(*generator, "--check"), run(*generator, *docs_command(page)), run(*generator, "--check")
    # Every list of methods, and EntropyGRPOConfig's file, was stale until the page's command wrote the method in, and
    # is up to date after it.
    assert (before.returncode, write.returncode, after.returncode) == (1, 0, 0), (before.stderr, write.stderr)
    written = {line.removeprefix("wrote ") for line in write.stdout.splitlines()}
    assert {line.removeprefix("stale: ") for line in before.stderr.splitlines()[:-1]} == written
    assert {"README.md: trainers", "README.md: method-names", "docs/README.md: method-pages"} <= written
    assert "trl_entropy/methods/combined.py: EntropyGRPOConfig" in written
    assert "    EntropyFloorConfig,\n" in (tmp_path / "trl_entropy" / "methods" / "combined.py").read_text()
    result = run(sys.executable, "-c", textwrap.dedent(SCRIPT), TOY_CACHE, str(tmp_path / "run"), OTHER.key)
    assert result.returncode == 0, result.stderr[-4000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    readme = (tmp_path / "README.md").read_text()
    assert "| `EntropyFloorTrainer` | [floor](docs/floor.md) |" in readme
    assert re.search(r"^`--method [\w|]+\|floor`$", readme, re.MULTILINE)  # the last name, as it is last in SPECS
    assert outcome["parts"] == [OTHER.key, "floor"]  # in axis order: advantages, then the regulariser
    assert outcome["coef"] > 0  # the floor's controller moved: its part ran beside the other method's
    assert outcome["logged"] == sorted([*(metric.key for metric in OTHER.metrics), "floor/coef"])
