"""Every ```python block of README.md and docs/*.md runs, and the example YAML configs parse with the right classes.

Snippets run in this process (importing TRL once keeps the whole file fast), each in a fresh namespace with a fresh
temporary working directory, in file order. The only thing patched is where `build_toy_policy` caches: a snippet that
calls it without a `cache_dir` gets the session's cache, the same weights it would build itself (the warm start is
deterministic), without paying for the warm start every time.
"""

import importlib.util
import re
import textwrap
from pathlib import Path

import pytest
import yaml

from trl_entropy.methods import METHODS, get_method


ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A fence may be indented (inside a list item); the block is dedented before it runs.
FENCE = re.compile(r"^[ \t]*```python[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)


def python_blocks(path: Path) -> list[str]:
    return [textwrap.dedent(block) for block in FENCE.findall(path.read_text())]


SNIPPETS = [
    pytest.param(path, index, code, id=f"{path.relative_to(ROOT)}[{index}]")
    for path in DOCUMENTS
    for index, code in enumerate(python_blocks(path))
]


def test_snippets_are_found():
    """The fence pattern finds what is there (a broken pattern would silently test nothing)."""
    sample = "text\n```python\nx = 1\n```\nmore\n```bash\nls\n```\n```python title\ny = 2\n```\n"
    assert FENCE.findall(sample) == ["x = 1\n", "y = 2\n"]
    indented = "* item:\n\n  ```python\n  z = 3\n  ```\n"
    assert [textwrap.dedent(block) for block in FENCE.findall(indented)] == ["z = 3\n"]
    assert python_blocks(ROOT / "README.md"), "README.md has no python block"
    assert python_blocks(ROOT / "docs" / "getting_started.md"), "getting_started.md has no python block"


@pytest.fixture(scope="session")
def toy_policy_cache(tmp_path_factory):
    from trl_entropy.toy import build_toy_policy

    cache = tmp_path_factory.mktemp("docs_toy_policy")
    build_toy_policy(seed=0, cache_dir=cache)
    return cache


@pytest.mark.parametrize(("path", "index", "code"), SNIPPETS)
def test_snippet_runs(path, index, code, toy_policy_cache, tmp_path, monkeypatch):
    import torch

    import trl_entropy.toy as toy

    original = toy.build_toy_policy

    def cached_build_toy_policy(seed=0, warm_start_steps=toy.TOY_WARM_START_STEPS, cache_dir=None):
        return original(seed=seed, warm_start_steps=warm_start_steps, cache_dir=cache_dir or toy_policy_cache)

    monkeypatch.setattr(toy, "build_toy_policy", cached_build_toy_policy)
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    try:
        exec(compile(code, f"{path.name}[{index}]", "exec"), {"__name__": "__main__"})
    finally:
        torch.set_num_threads(threads)


def test_snippets_train_briefly():
    """Snippets that train use the toy task with at most two optimizer steps (the docs tests stay fast)."""
    for path, _, code in (snippet.values for snippet in SNIPPETS):
        for steps in re.findall(r"max_steps\s*=\s*(\d+)", code):
            assert int(steps) <= 2, f"{path.name}: max_steps={steps}"


def load_train_module():
    spec = importlib.util.spec_from_file_location("train_example_docs", ROOT / "examples" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONFIGS = sorted((ROOT / "examples" / "configs").glob("*.yaml"))


def test_there_is_a_config_per_method_and_the_clip_low_recipe():
    names = {path.stem for path in CONFIGS}
    assert set(METHODS) <= names
    assert "clip_low" in names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_example_config_parses_with_its_method_config_class(path):
    train = load_train_module()
    values = yaml.safe_load(path.read_text())
    method = get_method(values["method"])
    argv = ["--config", str(path), "--output_dir", "unused"]
    script_args, training_args, _ = train.build_parser(argv).parse_args_and_config(args=argv)
    assert script_args.method == values["method"]
    assert type(training_args) is method.config_class
    for name, value in values.items():
        if name != "method":
            assert getattr(training_args, name) == value, name
    for name, value in method.defaults.items():  # the registry defaults hold unless the file overrides them
        assert getattr(training_args, name) == values.get(name, value), name


def test_clip_low_config_is_seed_003s_recipe():
    values = yaml.safe_load((ROOT / "examples" / "configs" / "clip_low.yaml").read_text())
    assert values["method"] == "grpo"
    assert values["epsilon"] == 0.15
    assert values["epsilon_high"] >= 1e3  # clip-high effectively off


ACCELERATE = {
    "single_gpu.yaml": ("NO", 1),
    "multi_gpu.yaml": ("MULTI_GPU", 8),
    "zero2.yaml": ("DEEPSPEED", 8),
    "zero3.yaml": ("DEEPSPEED", 8),
    "fsdp2.yaml": ("FSDP", 8),
}


@pytest.mark.parametrize("name", sorted(ACCELERATE))
def test_accelerate_config_loads(name):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

    config = load_config_from_file(str(ROOT / "examples" / "accelerate" / name))
    assert isinstance(config, ClusterConfig)
    distributed_type, processes = ACCELERATE[name]
    assert config.distributed_type.value == distributed_type
    assert config.num_processes == processes
    if name.startswith("zero"):
        assert config.deepspeed_config["zero_stage"] == int(name[4])
    if name == "fsdp2.yaml":
        assert config.fsdp_config["fsdp_version"] == 2
    assert sorted(path.name for path in (ROOT / "examples" / "accelerate").glob("*.yaml")) == sorted(ACCELERATE)
