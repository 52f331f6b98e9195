"""Every ```python block of README.md and docs/*.md runs without a warning, every `examples/train.py` command in them
parses, the example YAML configs parse with the right classes, the install instructions match setup.py, every list of
methods a user reads is written from the registry by docs/tables.py, up to date, and says what the registry and the
configs do, links resolve, and the papers are cited by title and arXiv id (never by the file names of the project's
own copies).

Snippets run in this process (importing TRL once keeps the whole file fast), each in a fresh namespace with a fresh
temporary working directory, in file order. The only thing patched is where `build_toy_policy` caches: a snippet that
calls it without a `cache_dir` gets the session's cache, the same weights it would build itself (the warm start is
deterministic), without paying for the warm start every time.
"""

import ast
import dataclasses
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

from trl_entropy.core.trl.noise import hide_known_upstream_noise
from trl_entropy.methods import METHODS, get_method


ROOT = Path(__file__).resolve().parents[2]
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


@pytest.mark.parametrize(("path", "index", "code"), SNIPPETS)
def test_snippet_runs(path, index, code, tmp_path, monkeypatch):
    """Each snippet as a script runs it; its warm-started toy policy comes from the tests' cache (``test_toy.py``
    checks a cached policy against a fresh build)."""
    import torch
    from _support.grpo import TOY_CACHE

    import trl_entropy.toy as toy

    original = toy.build_toy_policy

    def cached_build_toy_policy(seed=0, warm_start_steps=toy.TOY_WARM_START_STEPS, cache_dir=None):
        return original(seed=seed, warm_start_steps=warm_start_steps, cache_dir=cache_dir or TOY_CACHE)

    monkeypatch.setattr(toy, "build_toy_policy", cached_build_toy_policy)
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    try:
        # Run as a script runs: its module is __main__ (pickling a class it defines looks it up there). Every warning
        # is recorded but the known upstream noise the library hides: an example that warns (a setting it shows that
        # has no effect, say) teaches the wrong thing.
        script = types.ModuleType("__main__")
        monkeypatch.setitem(sys.modules, "__main__", script)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hide_known_upstream_noise()
            exec(compile(code, f"{path.name}[{index}]", "exec"), script.__dict__)
    finally:
        torch.set_num_threads(threads)
    assert [f"{item.category.__name__}: {item.message}" for item in caught] == []


def test_snippets_train_briefly():
    """Snippets that train use the toy task with at most two optimizer steps (the docs tests stay fast)."""
    for path, _, code in (snippet.values for snippet in SNIPPETS):
        for steps in re.findall(r"max_steps\s*=\s*(\d+)", code):
            assert int(steps) <= 2, f"{path.name}: max_steps={steps}"


def load_train_module():
    import trl_entropy.scripts.train_arguments as train_arguments  # what examples/train.py parses with

    return train_arguments


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


def train_arguments(words: list[str]) -> list[str] | None:
    """The arguments of a training command, `examples/train.py ...` or `trl-entropy train ...`; None for another."""
    if "examples/train.py" in words:
        return words[words.index("examples/train.py") + 1 :]
    if words[:2] == ["trl-entropy", "train"]:
        return words[2:]
    return None


TRAIN_COMMANDS = [
    pytest.param(train_arguments(words), id=f"{path.relative_to(ROOT)}:{' '.join(words)[:60]}")
    for path in DOCUMENTS
    for words in shell_commands(path)
    if train_arguments(words) is not None
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
CITATION_SCAN = ["README.md", "docs", "trl_entropy", "examples", "benchmarks"]


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


# ---------------------------------------------------------------------------------------------------------------------
# Every list of methods a user reads is written from the registry by docs/tables.py, is up to date, and says what the
# registry and the configs do (checked here against facts computed in the test, not against the generator's code)
# ---------------------------------------------------------------------------------------------------------------------

BASE_TRAINER = METHODS["grpo"].trainer_class
TRAINERS = list(dict.fromkeys(method.trainer_class for method in METHODS.values()))  # registry order, once each
METHOD_TRAINERS = [trainer for trainer in TRAINERS if trainer is not BASE_TRAINER]
GENERATED = re.compile(
    r"^<!-- generated by docs/tables\.py: ([\w-]+) -->\n(.*?)^<!-- end: \1 -->$", re.MULTILINE | re.DOTALL
)


def load_generator() -> types.ModuleType:
    """docs/tables.py, the generator (a script of the repository, not a module of the package)."""
    spec = importlib.util.spec_from_file_location("docs_tables", ROOT / "docs" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read(name: str) -> str:
    return (ROOT / name).read_text()


def passage(text: str, start: str, end: str = "\n\n") -> str:
    """The text from ``start`` up to the next ``end`` (the end of the paragraph or table by default)."""
    assert start in text, f"the docs no longer say {start!r}: update this test with them"
    tail = text[text.index(start) :]
    return tail[: tail.index(end)] if end in tail else tail


def region(name: str, document: str) -> str:
    """The generated region ``name`` of ``document``, as written there."""
    found = [body.strip() for found_name, body in GENERATED.findall(read(document)) if found_name == name]
    assert len(found) == 1, f"{document} holds {len(found)} generated regions {name!r}"
    return found[0]


def table_rows(table: str) -> list[list[str]]:
    """The body rows of a markdown table, as cells (``\\|`` is a pipe inside a cell)."""
    return [
        [cell.strip().replace(r"\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        for line in table.splitlines()[2:]
    ]


def method_page(trainer: type) -> str:
    """The page docs/README.md's index gives for ``trainer``."""
    index = dict(re.findall(r"^\s*\* \[(\w+\.md)\]\(\1\):[^\n]*?\(`(\w+)`\)", read("docs/README.md"), re.MULTILINE))
    pages = [page for page, name in index.items() if name == trainer.__name__]
    assert pages, f"docs/README.md's index lists no page for {trainer.__name__}"
    return pages[0]


def test_every_generated_region_is_up_to_date():
    stale = load_generator().stale_regions()
    assert stale == [], f"generated regions differ from the registry: {stale}; run: python docs/tables.py --write"


def test_the_generators_check_names_a_stale_region_and_write_mends_it(tmp_path, monkeypatch, capsys):
    """On a copy of the docs and of the combined config's file: a stale row, or a stale file, fails --check, which
    names the file, the region and the fix; --write mends it and nothing else; a region no renderer knows is
    refused."""
    generator = load_generator()
    (tmp_path / "docs").mkdir()
    combined = tmp_path / generator.COMBINED_CONFIG
    combined.parent.mkdir(parents=True)
    for path in [*DOCUMENTS, ROOT / generator.COMBINED_CONFIG]:
        (tmp_path / path.relative_to(ROOT)).write_text(path.read_text())
    monkeypatch.setattr(generator, "ROOT", tmp_path)
    generator.write_regions()  # the copy up to date, whatever the repository's state
    readme = tmp_path / "README.md"
    fresh = readme.read_text()
    trainer_row = next(line for line in fresh.splitlines() if line.startswith(f"| `{TRAINERS[-1].__name__}` |"))
    readme.write_text(fresh.replace(trainer_row + "\n", ""))
    assert generator.main(["--check"]) == 1
    assert capsys.readouterr().err.splitlines() == ["stale: README.md: trainers", "run: python docs/tables.py --write"]
    assert generator.main(["--write"]) == 0
    assert capsys.readouterr().out.splitlines() == ["wrote README.md: trainers"]
    assert readme.read_text() == fresh
    assert generator.main(["--check"]) == 0
    written = combined.read_text()
    combined.write_text(written.replace("    MethodsSelection,\n", ""))
    assert generator.main(["--check"]) == 1
    assert capsys.readouterr().err.splitlines()[0] == f"stale: {generator.COMBINED_CONFIG}: EntropyGRPOConfig"
    assert generator.main(["--write"]) == 0 and combined.read_text() == written
    readme.write_text(fresh + "\n<!-- generated by docs/tables.py: nothing -->\n<!-- end: nothing -->\n")
    with pytest.raises(ValueError, match="unknown region 'nothing'"):
        generator.stale_regions()


def test_train_py_offers_every_registered_method():
    train = load_train_module()
    (method,) = [field for field in dataclasses.fields(train.TrainScriptArguments) if field.name == "method"]
    described = [f"{name} = {entry.description}" for name, entry in METHODS.items()]
    positions = [method.metadata["help"].find(text) for text in described]
    assert -1 not in positions and positions == sorted(positions), "each method, described, in the registry's order"


@pytest.mark.parametrize("document", ["README.md", "docs/getting_started.md"])
def test_method_name_list_is_the_registry(document):
    listed = re.fullmatch(r"`--method ([\w|]+)`", region("method-names", document)).group(1).split("|")
    assert [name for name in METHODS if name not in listed] == [], f"{document} leaves out these methods"
    assert listed == list(METHODS), f"{document}: in the registry's order, each once, nothing else"


def test_readme_trainer_table_names_every_trainer_with_its_page_and_paper():
    rows = table_rows(region("trainers", "README.md"))
    assert [re.fullmatch(r"`(\w+)`", trainer).group(1) for trainer, _, _ in rows] == [t.__name__ for t in TRAINERS]
    for (_, method, controls), trainer in zip(rows, TRAINERS, strict=True):
        assert controls, f"README.md says nothing of what {trainer.__name__} controls"
        if trainer is BASE_TRAINER:
            assert "](" not in method and "arXiv:" not in method
            continue
        arxiv_id = trainer._paper["id"]  # what the trainer's model card cites
        assert method.endswith(f", arXiv:{arxiv_id}"), (trainer.__name__, method)
        assert f"](docs/{method_page(trainer)})" in method, (trainer.__name__, method)


def test_docs_index_has_a_page_for_every_method():
    for trainer in METHOD_TRAINERS:
        assert (ROOT / "docs" / method_page(trainer)).is_file()


def test_docs_index_lists_each_method_page_once():
    """docs/README.md's pages per method: one for each trainer of a method, nothing else, in the registry's order."""
    index = re.findall(r"^\s*\* \[(\w+\.md)\]\(\1\):[^\n]*?\(`(\w+)`\)", read("docs/README.md"), re.MULTILINE)
    listed = [trainer for _, trainer in index]
    assert listed == [trainer.__name__ for trainer in METHOD_TRAINERS]


def test_composing_places_table_is_the_table_of_places():
    """docs/composing.md's table of places: every place in the order the step asks it, with its seam, its rule, when
    it is asked, the names acting there (whose entry's ``acts_on`` names it) and whether several may act there."""
    from trl_entropy.core.config import EntropyGRPOBaseConfig
    from trl_entropy.methods import PLACES

    documented = [
        (int(order), place, seam.strip("`"), rule, asked, re.findall(r"`(\w+)`", methods), how_many)
        for order, place, seam, rule, asked, methods, how_many in table_rows(region("places", "docs/composing.md"))
    ]
    # A name controls the entropy unless it is plain GRPO: the base's config with no setting of its own.
    controls = {
        name: entry.config_class is not EntropyGRPOBaseConfig or bool(entry.defaults)
        for name, entry in METHODS.items()
    }
    expected = [
        (
            order,
            rule.title if rule.axis else f"{rule.title} (no axis)",
            rule.seam,
            rule.rule.value,
            rule.when,
            [name for name, entry in METHODS.items() if controls[name] and place in entry.acts_on],
            "one" if rule.axis and not rule.several else "any",
        )
        for order, (place, rule) in enumerate(PLACES.items(), start=1)
    ]
    assert documented == expected
    axes = [names for (*_, names, _), rule in zip(documented, PLACES.values(), strict=True) if rule.axis]
    every_axis = sorted(name for names in axes for name in names)
    assert every_axis == sorted(n for n in METHODS if controls[n])  # each name on exactly one axis


def test_report_page_describes_every_panel_the_report_draws():
    """docs/report.md: the report's own panels (entropy and reward, the law, pass@k), then one row per method panel in
    the order the report draws them, smoothed or as logged as it draws them, titled as drawn; and the entropy targets
    drawn dashed on the entropy panel."""
    from trl_entropy.report import controller_panels, entropy_targets

    own = table_rows(passage(read("docs/report.md"), "| panel | logged as | drawn |"))
    assert [re.match(r"`([\w/@]+)`", logged).group(1) for _, logged, _ in own] == ["entropy", "entropy", "eval/pass@k"]
    rows = table_rows(region("panels", "docs/report.md"))
    panels, targets = rows[: len(controller_panels())], rows[len(controller_panels()) :]
    assert [(logged, drawn) for _, logged, drawn in panels] == [
        (f"`{panel.key}`", "faint and moving average" if panel.smooth else "as logged")
        for panel in controller_panels()
    ]
    for (title, _, _), panel in zip(panels, controller_panels(), strict=True):
        assert title and panel.title.startswith(title), (title, panel.title)
    assert [(label, logged) for label, logged, _ in targets] == [
        (label, f"`{key}`") for key, label in entropy_targets().items()
    ]
    assert {drawn for _, _, drawn in targets} <= {"dashed, on the entropy panel"}


def test_references_cite_every_method_paper_beside_its_trainer():
    rows = [line for line in read("docs/references.md").splitlines() if line.startswith("| ") and "arXiv:" in line]
    for trainer in METHOD_TRAINERS:
        arxiv_id = trainer._paper["id"]
        assert any(
            f"`{trainer.__name__}`" in row and f"[arXiv:{arxiv_id}](https://arxiv.org/abs/{arxiv_id})" in row
            for row in rows
        ), f"docs/references.md has no row citing arXiv:{arxiv_id} for {trainer.__name__}"
        assert f"arXiv:{arxiv_id}" in read("README.md"), f"README.md does not cite {trainer.__name__}'s paper"


def test_which_method_table_offers_every_method():
    table = region("which-method", "docs/getting_started.md")
    for name, method in METHODS.items():
        trainer = method.trainer_class
        offered = f"`--method {name}`" in table or (
            trainer is not BASE_TRAINER and f"]({method_page(trainer)})" in table
        )
        assert offered, f"getting_started.md's 'Which method' table offers neither `--method {name}` nor its page"
    assert all(want for want, *_ in table_rows(table)), "a row of 'Which method' says nothing of what you want"


def test_what_to_watch_names_every_method_metric_and_who_logs_it():
    """getting_started.md's "What to watch": the metrics every trainer logs; report.md's "Each method's metrics": each
    method's own, each with the names that log it."""
    from _support.methods import METHOD_METRIC  # a metric only that method logs

    section = passage(read("docs/getting_started.md"), "## 5. What to watch", "## 6.")
    listed = re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE)
    assert {"entropy", "entropy/cov_logp_adv"} <= set(listed), listed
    assert "](report.md#each-methods-metrics)" in section, "What to watch no longer links the methods' metrics"
    section = passage(read("docs/report.md"), "## Each method's metrics", "\n## ")
    listed += re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE)
    for name, metric in METHOD_METRIC.items():
        assert metric in listed, f"the metrics tables of getting_started.md and report.md leave out {metric} ({name})"
    generated = table_rows(region("metrics", "docs/report.md"))
    logged_by = {metric.strip("`"): names for metric, names, _ in generated}
    for name, entry in METHODS.items():
        for metric in entry.metrics:
            assert f"`{name}`" in logged_by[metric.key], (
                f"the metrics table does not say that {name} logs {metric.key}"
            )


def loss_type_outcome(entry, loss_type: str, output_dir) -> str:
    """What the config of ``entry`` does with ``loss_type``: "works", or "refused" (a ValueError)."""
    options = {**entry.defaults, "loss_type": loss_type, "output_dir": str(output_dir), "use_cpu": True}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # on-policy notices are about the training layout, not the loss type
        try:
            entry.config_class(**options, report_to=[])
        except ValueError:
            return "refused"
    return "works"


def test_loss_type_table_is_what_each_config_does(tmp_path):
    """docs/loss_types.md's method × loss-type table: each cell is what building the method's config with that loss
    type does, for every name of the method; each row links to its page's section on loss types."""
    from trl_entropy.core.trl.objectives import LOSS_TYPES
    from trl_entropy.methods import SPECS

    table = region("loss-types", "docs/loss_types.md")
    header = [cell.strip() for cell in table.splitlines()[0].strip("|").split("|")]
    assert header == ["method", *LOSS_TYPES]
    rows = {label: cells for label, *cells in table_rows(table)}
    assert len(rows) == len(SPECS)
    for spec in SPECS:
        shown = spec.name or "GRPO"
        (label,) = [label for label in rows if re.sub(r"\(.*\)", "", label).strip() == shown]
        if spec.trainer_class is not BASE_TRAINER:
            page = method_page(spec.trainer_class)
            assert f"]({page}#loss-types)" in label
            assert "\n## Loss types\n" in read(f"docs/{page}"), f"docs/{page} has no section on loss types"
        for name in spec.entries():
            outcomes = [loss_type_outcome(METHODS[name], loss_type, tmp_path) for loss_type in LOSS_TYPES]
            assert rows[label] == outcomes, f"{name}: the table says {rows[label]}, its config does {outcomes}"


def test_getting_started_names_every_extra():
    sentence = passage(read("docs/getting_started.md"), "The extras:", "; the")
    assert sorted(re.findall(r"`(\w+)` \(", sentence)) == sorted(setup_extras())


def test_getting_started_toy_recipe_is_the_toy_defaults():
    from trl_entropy.toy import TOY_NUM_PROMPTS, TOY_TRAINING_DEFAULTS

    recipe = passage(read("docs/getting_started.md"), "with the toy recipe (", "TOY_TRAINING_DEFAULTS")
    recipe = " ".join(recipe.split())
    found = re.search(
        r"batches of (\d+) prompts x (\d+) completions from a pool of (\d+) prompts, each batch trained on twice "
        r"\(`num_iterations=(\d+)`\), learning rate ([\d.e-]+), (\d+) steps",
        recipe,
    )
    assert found, recipe
    prompts, completions, pool, iterations, learning_rate, steps = found.groups()
    defaults = TOY_TRAINING_DEFAULTS
    assert int(completions) == defaults["num_generations"]
    assert int(prompts) * int(completions) == defaults["per_device_train_batch_size"]
    assert int(pool) == TOY_NUM_PROMPTS
    assert int(iterations) == defaults["num_iterations"] == 2  # "twice"
    assert float(learning_rate) == defaults["learning_rate"]
    assert int(steps) == defaults["max_steps"]


def test_package_summary_names_no_method():
    """setup.py's description is what `pip show` prints: it names no method, so a new one cannot leave it stale."""
    tree = ast.parse(read("setup.py"))
    (description,) = [
        node.value.value for node in ast.walk(tree) if isinstance(node, ast.keyword) and node.arg == "description"
    ]
    for trainer in METHOD_TRAINERS:
        assert not re.search(rf"\b{re.escape(trainer._name)}\b", description), trainer._name
