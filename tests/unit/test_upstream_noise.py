"""`import trl_entropy` changes no warning or logging filter of the importing process; the library's programs call
`hide_known_upstream_noise()`, which hides the known upstream noise a run provokes (transformers' deprecation notices,
DeepSpeed's accelerator note) and nothing else, this library's warnings above all."""

import ast
import json
import logging
import sys
import warnings
from pathlib import Path

import pytest
from _support.watchdog import run_watched

from trl_entropy.core.trl.noise import KNOWN_UPSTREAM_LOG, hide_known_upstream_noise, is_not_known_upstream_log


PACKAGE = Path(__file__).resolve().parents[2] / "trl_entropy"


# A program built on the library, as its own programs are: a short run of the toy task after
# `hide_known_upstream_noise()`, set up so that it provokes one warning of ours (a clip range that on-policy training
# never uses). It prints what it saw beneath what was printed: every record DeepSpeed logged (recorded by a filter
# placed ahead of the library's), and the FutureWarnings of the same run with every warning on.
SCRIPT = """
import json, logging, sys, warnings

logged = []
logging.getLogger("DeepSpeed").addFilter(lambda record: logged.append(record.getMessage()) or True)

from trl_entropy import EntropyGRPOConfig, EntropyGRPOTrainer
from trl_entropy.toy import build_toy_dataset, build_toy_model, build_toy_tokenizer, toy_reward
from trl_entropy.core.trl.noise import hide_known_upstream_noise

hide_known_upstream_noise()


def run(output_dir):
    tokenizer = build_toy_tokenizer()
    args = EntropyGRPOConfig(
        output_dir=output_dir, per_device_train_batch_size=8, num_generations=4, max_completion_length=4, max_steps=1,
        epsilon_high=0.28, save_strategy="no", report_to=[], use_cpu=True, bf16=False, disable_tqdm=True,
    )
    EntropyGRPOTrainer(
        model=build_toy_model(tokenizer, seed=0), reward_funcs=toy_reward, args=args,
        train_dataset=build_toy_dataset(8, seed=0), processing_class=tokenizer,
    ).train()


run(sys.argv[1] + "/quiet")
with warnings.catch_warnings(record=True) as raised:
    warnings.simplefilter("always")
    run(sys.argv[1] + "/loud")
upstream = sorted({str(item.message) for item in raised if item.category is FutureWarning})
print("SEEN " + json.dumps({"deepspeed_imported": "deepspeed" in sys.modules, "logged": logged, "upstream": upstream}))
"""


def test_a_short_run_prints_no_upstream_noise_and_our_warning_still_shows(tmp_path):
    """In a fresh process, as a program runs it: the noise is raised (shown by the run with every warning on, and by
    DeepSpeed's log records) but never printed; the on-policy clip warning of ours is."""
    script = tmp_path / "short_run.py"
    script.write_text(SCRIPT)
    done = run_watched([sys.executable, str(script), str(tmp_path)], "a short run in a fresh process", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    printed, seen = done.stdout.rsplit("SEEN ", 1)
    printed += done.stderr
    seen = json.loads(seen)
    upstream = seen["upstream"]
    for name in ("gradient_checkpointing", "is_gradient_checkpointing", "gradient_checkpointing_enable"):
        assert any(message.startswith(f"`{name}` is deprecated") for message in upstream), (name, upstream)
    assert "is deprecated" not in printed and "FutureWarning" not in printed
    if seen["deepspeed_imported"]:  # the deepspeed extra: accelerate imports it while the trainer is built
        import torch

        if not torch.cuda.is_available():
            assert any(message.startswith(KNOWN_UPSTREAM_LOG[1]) for message in seen["logged"]), seen["logged"]
    assert KNOWN_UPSTREAM_LOG[1] not in printed
    assert "UserWarning: epsilon=0.2, epsilon_high=0.28 with fully on-policy updates" in printed


@pytest.mark.parametrize(
    ("category", "module", "hidden"),
    [
        (FutureWarning, "transformers.training_args", True),
        (FutureWarning, "transformers.modeling_utils", True),
        (FutureWarning, "trl_entropy.core.config", False),  # ours, even in upstream's words
        (FutureWarning, "__main__", False),  # the user's
        (UserWarning, "transformers.training_args", False),
    ],
)
def test_only_the_known_upstream_warnings_are_hidden(category, module, hidden):
    message = "`gradient_checkpointing` is deprecated and will be removed in v6."
    with warnings.catch_warnings(record=True) as shown:
        warnings.resetwarnings()  # the library's filter alone (the test configuration hides the same words)
        warnings.simplefilter("always")
        hide_known_upstream_noise()
        warnings.warn_explicit(message, category, "somewhere.py", 1, module=module)
    assert [str(item.message) for item in shown] == ([] if hidden else [message])


@pytest.mark.parametrize(
    ("logger", "message", "hidden"),
    [
        ("DeepSpeed", f"{KNOWN_UPSTREAM_LOG[1]}. If you have GPU or other accelerator, we were unable to ...", True),
        ("DeepSpeed", "Setting ds_accelerator to cuda (auto detect)", False),
        ("trl_entropy", KNOWN_UPSTREAM_LOG[1], False),
    ],
)
def test_only_the_known_upstream_log_line_is_hidden(logger, message, hidden):
    record = logging.LogRecord(logger, logging.WARNING, "somewhere.py", 1, message, None, None)
    assert is_not_known_upstream_log(record) is not hidden


def test_the_log_filter_is_installed_once_however_often_the_programs_call():
    deepspeed = logging.getLogger(KNOWN_UPSTREAM_LOG[0])
    before = list(deepspeed.filters)
    try:
        hide_known_upstream_noise()
        hide_known_upstream_noise()
        assert deepspeed.filters.count(is_not_known_upstream_log) == 1
    finally:
        deepspeed.filters[:] = before  # this process's filters as they were


# A library user's process: what it sees of the warning filters, and of the filters of the loggers whose messages
# the library knows, before and after importing the library (the registry and its trainers included). The modules of
# other packages that the library imports, and the names it takes from them (argv[1]; a lazy module such as TRL's
# imports a submodule when a name is taken), are imported first: some add warning filters of their own.
IMPORT_CHECK = """
import importlib, json, logging, sys, warnings

LOGGERS = ("DeepSpeed", "transformers.trainer", "transformers", "trl_entropy", "")


def state():
    loggers = {name: list(logging.getLogger(name).filters) for name in LOGGERS}
    return list(warnings.filters), warnings.showwarning, loggers


for name, attributes in json.loads(sys.argv[1]):
    try:
        module = importlib.import_module(name)
        for attribute in attributes:
            getattr(module, attribute, None)
    except Exception:  # an optional dependency (the extras) that is not installed, or that needs a GPU
        pass
assert not any(name.split(".")[0] == "trl_entropy" for name in sys.modules)
before = state()
import trl_entropy
import trl_entropy.methods
import trl_entropy.core.checkpoint
import trl_entropy.core.trl.noise
trl_entropy.EntropyGRPOTrainer
after = state()
assert after[0] == before[0], [entry for entry in after[0] if entry not in before[0]]
assert after[1:] == before[1:], (before[1:], after[1:])
print("UNCHANGED")
"""


def imported_at_import(tree: ast.Module) -> list[tuple[str, tuple[str, ...]]]:
    """The modules of other packages that a module's own code imports at import (:func:`module_level_nodes`), each
    with the names it takes from them."""
    imported = []
    for node in module_level_nodes(tree):
        if isinstance(node, ast.Import):
            imported += [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.append((node.module, tuple(alias.name for alias in node.names)))
    return [(name, attributes) for name, attributes in imported if name.split(".")[0] != "trl_entropy"]


def test_importing_the_library_changes_no_warning_or_logging_filter():
    dependencies = sorted({imported for path in PACKAGE.rglob("*.py") for imported in imported_at_import(parse(path))})
    assert {"torch", "transformers", "trl"} <= {name.split(".")[0] for name, _ in dependencies}
    done = run_watched([sys.executable, "-c", IMPORT_CHECK, json.dumps(dependencies)], "the import check")
    assert done.returncode == 0 and "UNCHANGED" in done.stdout, done.stderr[-4000:]


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def module_level_nodes(tree: ast.Module) -> list[ast.AST]:
    """What a module's own code runs at import: every node outside functions and outside its
    ``if __name__ == "__main__":`` block (class bodies run at import)."""
    nodes, pending = [], list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            continue
        nodes.append(node)
        pending.extend(ast.iter_child_nodes(node))
    return nodes


def module_level_calls(tree: ast.Module) -> list[str]:
    """The names a module's own code calls at import."""
    return [
        ast.unparse(node.func).rsplit(".", 1)[-1] for node in module_level_nodes(tree) if isinstance(node, ast.Call)
    ]


FILTER_CHANGES = {"hide_known_upstream_noise", "filterwarnings", "simplefilter", "resetwarnings", "addFilter"}


def test_no_module_of_the_package_changes_a_filter_at_import():
    """The source check of the test above, over every module (those the import test does not reach included)."""
    assert module_level_calls(ast.parse("f()\nif __name__ == '__main__':\n    g()\ndef h():\n    i()\n")) == ["f"]
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(FILTER_CHANGES.intersection(calls))
        for path in sorted(PACKAGE.rglob("*.py"))
        if FILTER_CHANGES.intersection(calls := module_level_calls(parse(path)))
    }
    assert offenders == {}
