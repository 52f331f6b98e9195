"""Every ```python block of README.md and docs/*.md runs, every `examples/train.py` command in them parses, the example
YAML configs parse with the right classes, the install instructions match setup.py, links resolve, and the papers are
cited by title and arXiv id (never by the file names of the project's own copies).

Snippets run in this process (importing TRL once keeps the whole file fast), each in a fresh namespace with a fresh
temporary working directory, in file order. The only thing patched is where `build_toy_policy` caches: a snippet that
calls it without a `cache_dir` gets the session's cache, the same weights it would build itself (the warm start is
deterministic), without paying for the warm start every time.
"""

import ast
import importlib.util
import re
import shlex
import sys
import textwrap
import types
import warnings
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
        # Run as a script runs: its module is __main__ (pickling a class it defines looks it up there).
        script = types.ModuleType("__main__")
        monkeypatch.setitem(sys.modules, "__main__", script)
        exec(compile(code, f"{path.name}[{index}]", "exec"), script.__dict__)
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
    _, script_args, training_args, _ = train.parse_arguments(argv)
    assert script_args.method == values["method"]
    assert type(training_args) is method.config_class
    for name, value in values.items():
        if name != "method":
            assert getattr(training_args, name) == value, name
    for name, value in method.defaults.items():  # the registry defaults hold unless the file overrides them
        assert getattr(training_args, name) == values.get(name, value), name


def test_clip_low_config_is_the_clip_low_recipe():
    """Park et al., "Clip-Low Increases Entropy and Clip-High Decreases Entropy ...", arXiv:2509.26114."""
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


BASH_FENCE = re.compile(r"^[ \t]*```bash[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)


def shell_commands(path: Path) -> list[list[str]]:
    """The commands of the ```bash blocks of ``path``, continuation lines joined and comments dropped, as words."""
    commands = []
    for block in BASH_FENCE.findall(path.read_text()):
        for line in textwrap.dedent(block).replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


TRAIN_COMMANDS = [
    pytest.param(words[words.index("examples/train.py") + 1 :], id=f"{path.relative_to(ROOT)}:{' '.join(words)[:60]}")
    for path in DOCUMENTS
    for words in shell_commands(path)
    if "examples/train.py" in words
]


def test_train_commands_are_found(tmp_path):
    path = tmp_path / "sample.md"
    path.write_text(
        "```bash\n# note\npython examples/train.py --method aent \\\n    --max_steps 5  # short\nls\n```\n"
    )
    assert shell_commands(path) == [["python", "examples/train.py", "--method", "aent", "--max_steps", "5"], ["ls"]]
    assert len(TRAIN_COMMANDS) >= 5


@pytest.mark.parametrize("arguments", TRAIN_COMMANDS)
def test_train_command_in_the_docs_parses(arguments, monkeypatch):
    """Each documented command line is accepted as written, from the repository root, on a machine with a bf16 GPU
    (several commands are for one): every flag exists, every value has its type, every file it names is there."""
    import transformers.training_args

    train = load_train_module()
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(train, "bf16_accelerator_available", lambda: True)
    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)
    for word in arguments:
        if word.startswith("examples/"):
            assert (ROOT / word).exists(), word
    if "--help" in arguments:
        with pytest.raises(SystemExit) as exit_info:
            train.parse_arguments(arguments)
        assert exit_info.value.code == 0
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, script_args, training_args, model_args = train.parse_arguments(arguments)
    assert type(training_args) is get_method(script_args.method).config_class
    # A config's own warning means the documented run is set up so that its method does nothing (e.g. on-policy ADAPO).
    assert [str(item.message) for item in caught if issubclass(item.category, UserWarning)] == []


def test_accelerate_commands_name_existing_configs():
    commands = [words for path in DOCUMENTS for words in shell_commands(path) if words[:2] == ["accelerate", "launch"]]
    assert commands
    for words in commands:
        if "--config_file" in words:
            assert (ROOT / words[words.index("--config_file") + 1]).is_file(), words


def setup_extras() -> dict[str, list[str]]:
    """setup.py's extras_require, read from its source (the literal dict)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "extras_require":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no extras_require")


def requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0]


def test_readme_extras_table_matches_setup_py():
    readme = (ROOT / "README.md").read_text()
    table_text = readme[readme.index("| extra | installs | for |") :].split("\n\n")[0]
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \| [^|]+ \|$", table_text, re.MULTILINE)
    table = {extra: sorted(name.strip() for name in installs.split(",")) for extra, installs in rows}
    assert table == {extra: sorted(map(requirement_name, packages)) for extra, packages in setup_extras().items()}


def test_readme_ci_install_block():
    """The block CI runs installs the tested PyTorch pin and an extra setup.py declares."""
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("<!-- ci:install -->") :].split("```")[1]
    lines = block.strip().splitlines()[1:]  # after the "bash" tag
    assert lines[0] == "pip install torch==2.13.0"
    extra = re.fullmatch(r'pip install -e "\.\[(\w+)\]"', lines[1]).group(1)
    assert extra in setup_extras()


MARKDOWN_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_resolve(path):
    for target in MARKDOWN_LINK.findall(path.read_text()):
        if not re.match(r"\w+://", target):
            assert (path.parent / target).exists(), f"{path.name} links to missing {target}"


# The references table of the project's specification: the papers, by arXiv id.
ARXIV_IDS = ["2509.03493", "2505.22617", "2603.11682", "2509.26114"]


def test_references_page_cites_every_paper_and_is_linked():
    references = (ROOT / "docs" / "references.md").read_text()
    for arxiv_id in ARXIV_IDS:
        assert f"[arXiv:{arxiv_id}](https://arxiv.org/abs/{arxiv_id})" in references
    assert "](docs/references.md)" in (ROOT / "README.md").read_text()
    assert "](references.md)" in (ROOT / "docs" / "README.md").read_text()


SEED_CITATION = re.compile(r"seed 00\d", re.IGNORECASE)
CITATION_SCAN = ["README.md", "docs", "trl_entropy", "kernels", "examples", "benchmarks"]


def seed_citations() -> list[str]:
    """`file:line: text` for every "seed 00N" (the file names of the project's copies of the papers)."""
    found = []
    for name in CITATION_SCAN:
        root = ROOT / name
        for path in sorted([root] if root.is_file() else root.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            try:
                text = path.read_text()
            except UnicodeDecodeError:  # images
                continue
            for number, line in enumerate(text.splitlines(), 1):
                if SEED_CITATION.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_papers_are_cited_by_title_and_arxiv_id_not_seed_file():
    assert SEED_CITATION.search("(Seed 003, §2)") and not SEED_CITATION.search("seed 0 and seed 1")
    found = seed_citations()
    assert not found, "cite the title and arXiv id (docs/references.md) instead of:\n" + "\n".join(found)
