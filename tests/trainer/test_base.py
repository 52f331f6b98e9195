"""The base trainer's plumbing: validation, the controller window, checkpoints, diagnostics, packaging."""

import json
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from _support.distributed_run import ADAPTIVE_METHODS
from _support.grpo import (
    ONE_STEP_RUN,
    SMALL_BATCH,
    TOY_CACHE,
    make_grpo_batch,
    naive_entropy,
    naive_log_probs,
    on_policy_warnings,
    toy_config,
    toy_trainer,
)
from _support.watchdog import run_watched

from trl_entropy import Controller, EntropyGRPOConfig, EntropyGRPOTrainer
from trl_entropy.core.config import EntropyGRPOBaseConfig
from trl_entropy.core.head import install_entropy_head
from trl_entropy.core.parts import MethodPart
from trl_entropy.core.statistics import covariance_from_moments, covariance_moments, token_covariance
from trl_entropy.core.trl.pin import check_trl_version
from trl_entropy.methods import METHODS, get_method
from trl_entropy.toy import build_toy_dataset, build_toy_model


ROOT = Path(__file__).resolve().parents[2]


def config(tmp_path, config_class=EntropyGRPOConfig, **options):
    return toy_config(config_class, tmp_path, **{**SMALL_BATCH, **options})


class RecordingController(Controller):
    """Records what the trainer hands it; its value counts the updates."""

    name = "recorder"
    statistic = "entropy"

    def __init__(self):
        self.calls = []

    def update(self, mean_statistic, step):
        self.calls.append((mean_statistic, step))

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = [tuple(call) for call in state["calls"]]

    def metrics(self):
        return {"recorder/updates": float(len(self.calls))}


class RecordingPart(MethodPart):
    key = "recorder"

    def controllers(self):
        return [RecordingController()]


@dataclass
class RecordingConfig(EntropyGRPOBaseConfig):
    method_parts: ClassVar[tuple[type, ...]] = (RecordingPart,)


class RecordingTrainer(EntropyGRPOTrainer):
    config_class = RecordingConfig


def build(trainer_class, model, tokenizer, args):
    trainer = toy_trainer(trainer_class, args, model, tokenizer, train_dataset=build_toy_dataset(16))
    trainer.model.train()
    return trainer


# ---------------------------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------------------------


def test_unknown_loss_type_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="EntropyGRPO does not support loss_type='ppo'; choose one of"):
        config(tmp_path, loss_type="ppo")


@pytest.mark.parametrize(
    "field, value",
    [("entropy_kernel_backend", "cuda"), ("entropy_kernel_chunk_size", 0), ("entropy_kernel_chunk_size", -3)],
)
def test_invalid_kernel_options_are_rejected(tmp_path, field, value):
    with pytest.raises(ValueError, match=field):
        config(tmp_path, **{field: value})


CLIP_CASES = [  # (config options, whether the clip range is inert and a warning is due)
    ({"epsilon": 0.15, "epsilon_high": 1e9}, True),  # the clip-low recipe, on-policy
    ({"epsilon_high": 0.28}, True),  # clip-higher, on-policy
    ({"epsilon": 0.15, "epsilon_high": 1e9, "num_iterations": 2}, False),
    ({"epsilon": 0.15, "epsilon_high": 1e9, "steps_per_generation": 2}, False),
    ({}, False),  # TRL's default clip: nothing to say
]


@pytest.mark.parametrize("options, warns", CLIP_CASES)
def test_clip_range_warns_once_when_on_policy(tmp_path, options, warns):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config(tmp_path, **options)
    inert = [w for w in caught if "the clip range has no effect" in str(w.message)]
    assert len(inert) == (1 if warns else 0)
    if warns:
        assert "num_iterations > 1 or steps_per_generation > gradient_accumulation_steps" in str(inert[0].message)


# Generation layouts: (gradient_accumulation_steps, config options, whether every generation batch serves a single
# optimizer step, so that training is fully on-policy).
LAYOUTS = [
    (1, {}, True),  # TRL's defaults: one pass, steps_per_generation = gradient_accumulation_steps
    (2, {}, True),  # steps_per_generation follows the accumulation: still on-policy
    (4, {"steps_per_generation": 2}, True),  # two generations inside one optimizer step, no pass repeated
    (1, {"num_iterations": 2}, False),
    (2, {"steps_per_generation": 4}, False),
    (1, {"steps_per_generation": 2}, False),
]


@pytest.mark.parametrize("method", sorted(METHODS))
def test_on_policy_training_warns_at_most_once_and_only_on_policy(method, toy_model_path, toy_tokenizer, tmp_path):
    """A method that acts only off-policy says so once, when its trainer is built, on every on-policy layout and on
    none other, naming the settings that make it act; its loss steps add nothing. Its own test file checks that it
    warns, in its words."""
    spec = METHODS[method]
    subjects = []
    for index, (accumulation, options, on_policy) in enumerate(LAYOUTS):
        messages = on_policy_warnings(
            method,
            toy_model_path,
            toy_tokenizer,
            tmp_path / str(index),
            accumulation,
            **spec.defaults,
            **options,
        )
        if not on_policy:
            assert messages == [], (accumulation, options)
            continue
        assert len(messages) <= 1, messages
        for message in messages:
            assert "num_iterations > 1" in message and "steps_per_generation > gradient_accumulation_steps" in message
        subjects.append([message.split(" with fully on-policy updates")[0] for message in messages])
    assert all(found == subjects[0] for found in subjects), subjects  # the same warning on every on-policy layout


def headless_model(tokenizer):
    return build_toy_model(tokenizer).model  # the backbone alone: no LM head


@pytest.mark.parametrize("given_by", ["instance", "path"])
def test_a_model_the_head_cannot_score_is_rejected_before_trl_set_up(toy_tokenizer, tmp_path, given_by):
    model = headless_model(toy_tokenizer)
    if given_by == "path":
        # first a model with its head at the same path: the check follows the config found there, not the path
        build_toy_model(toy_tokenizer).save_pretrained(tmp_path / "model")
        toy_tokenizer.save_pretrained(tmp_path / "model")
        build(EntropyGRPOTrainer, str(tmp_path / "model"), toy_tokenizer, config(tmp_path))
        model.save_pretrained(tmp_path / "model")
        model = str(tmp_path / "model")
    with pytest.raises(ValueError, match="LlamaModel has no output embedding"):
        build(EntropyGRPOTrainer, model, toy_tokenizer, config(tmp_path))
    with pytest.raises(ValueError, match="no output embedding"):
        install_entropy_head(headless_model(toy_tokenizer), temperature=1.0)


@pytest.mark.parametrize(
    "installed, supported", [("1.16.0", True), ("1.16.3.dev0", True), ("1.15.2", False), ("1.17.0", False)]
)
def test_trl_version_guard(installed, supported):
    if supported:
        assert check_trl_version(installed) == installed
    else:
        with pytest.raises(ImportError, match=r"trl>=1\.16\.0,<1\.17\.0"):
            check_trl_version(installed)


# ---------------------------------------------------------------------------------------------------------------------
# Controller plumbing
# ---------------------------------------------------------------------------------------------------------------------


def float64_entropy_sums(model, inputs):
    """Σ m·H and Σ m of a micro-batch, from the full logits in float64."""
    entropy = naive_entropy(model, inputs)
    mask = inputs["completion_mask"].double()
    return (entropy * mask).sum().item(), mask.sum().item()


def test_controller_sees_the_window_token_mean(toy_model_path, toy_tokenizer, tmp_path):
    trainer = build(
        RecordingTrainer,
        toy_model_path,
        toy_tokenizer,
        config(tmp_path, RecordingConfig, gradient_accumulation_steps=2),
    )
    trainer.current_gradient_accumulation_steps = 2
    controller = trainer.controllers["recorder"]
    # Micro-batches with different token counts: a mean of the two means would differ from the token mean.
    first = make_grpo_batch(trainer.model, len(toy_tokenizer), seed=1)
    second = make_grpo_batch(trainer.model, len(toy_tokenizer), seed=2, batch=2)
    second["completion_mask"][1, 1:] = 0
    totals = [float64_entropy_sums(trainer.model, batch) for batch in (first, second)]
    trainer.state.global_step = 6
    trainer.accelerator.gradient_state._set_sync_gradients(False)
    trainer.compute_loss(trainer.model, first)
    assert controller.calls == []  # no update inside the window
    trainer.accelerator.gradient_state._set_sync_gradients(True)
    trainer.compute_loss(trainer.model, second)
    expected = sum(t[0] for t in totals) / sum(t[1] for t in totals)
    assert len(controller.calls) == 1
    mean, step = controller.calls[0]
    assert mean == pytest.approx(expected, rel=1e-6)
    assert step == 7  # the optimizer step the window completes
    assert trainer._metrics["train"]["recorder/updates"] == [1.0]
    # Evaluation never moves a controller.
    trainer.model.eval()
    trainer.compute_loss(trainer.model, first)
    assert len(controller.calls) == 1


def test_non_finite_statistic_holds_the_controller(toy_model_path, toy_tokenizer, tmp_path):
    trainer = build(RecordingTrainer, toy_model_path, toy_tokenizer, config(tmp_path, RecordingConfig))
    trainer.current_gradient_accumulation_steps = 1
    batch = make_grpo_batch(trainer.model, len(toy_tokenizer), seed=3)
    batch["completion_mask"].zero_()  # no valid token anywhere: the mean is undefined
    with pytest.warns(UserWarning, match="keeps its value"):
        loss = trainer.compute_loss(trainer.model, batch)
    assert trainer.controllers["recorder"].calls == []
    assert torch.isfinite(loss)
    loss.backward()  # an all-masked micro-batch stays connected to the graph


# ---------------------------------------------------------------------------------------------------------------------
# Diagnostics
# ---------------------------------------------------------------------------------------------------------------------


def test_token_covariance_matches_the_definition():
    generator = torch.Generator().manual_seed(0)
    log_probs = -torch.rand(3, 5, generator=generator) * 4
    advantages = torch.randn(3, generator=generator)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]])
    valid = [(i, t) for i in range(3) for t in range(5) if mask[i, t]]
    mean_l = sum(float(log_probs[i, t]) for i, t in valid) / len(valid)
    mean_a = sum(float(advantages[i]) for i, t in valid) / len(valid)
    covariance = token_covariance(log_probs, advantages, mask)
    for i in range(3):
        for t in range(5):
            expected = (float(log_probs[i, t]) - mean_l) * (float(advantages[i]) - mean_a) if mask[i, t] else 0.0
            assert float(covariance[i, t]) == pytest.approx(expected, rel=1e-5, abs=1e-6)
    # The moments form gives the token mean of the same terms, and adds across micro-batches.
    expected_mean = sum(float(covariance[i, t]) for i, t in valid) / len(valid)
    assert covariance_from_moments(covariance_moments(log_probs, advantages, mask)) == pytest.approx(
        expected_mean, rel=1e-5
    )
    halves = covariance_moments(log_probs[:1], advantages[:1], mask[:1]) + covariance_moments(
        log_probs[1:], advantages[1:], mask[1:]
    )
    assert covariance_from_moments(halves) == pytest.approx(expected_mean, rel=1e-5)
    assert covariance_from_moments(torch.zeros(4, dtype=torch.float64)) == 0.0


def test_cov_logp_adv_is_logged(toy_model_path, toy_tokenizer, tmp_path):
    trainer = build(EntropyGRPOTrainer, toy_model_path, toy_tokenizer, config(tmp_path))
    trainer.current_gradient_accumulation_steps = 1
    batch = make_grpo_batch(trainer.model, len(toy_tokenizer), seed=4, old_noise=None)
    trainer.compute_loss(trainer.model, batch)
    log_probs = naive_log_probs(trainer.model, batch)
    mask = batch["completion_mask"].bool()
    sampled = log_probs[mask]
    advantages = batch["advantages"].double().unsqueeze(1).expand_as(log_probs)[mask]
    expected = ((sampled - sampled.mean()) * (advantages - advantages.mean())).mean().item()
    assert trainer._metrics["train"]["entropy/cov_logp_adv"] == [pytest.approx(expected, rel=1e-4, abs=1e-7)]


# ---------------------------------------------------------------------------------------------------------------------
# End to end and packaging
# ---------------------------------------------------------------------------------------------------------------------


def test_training_on_the_toy_task(warm_toy_policy_path, toy_tokenizer, tmp_path):
    args = config(tmp_path, max_steps=3, per_device_train_batch_size=8, logging_steps=1, max_completion_length=8)
    trainer = build(EntropyGRPOTrainer, warm_toy_policy_path, toy_tokenizer, args)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "entropy" in entry]
    assert len(logged) == 3
    for entry in logged:
        assert 0 < entry["entropy"] < math.log(len(toy_tokenizer))
        assert math.isfinite(entry["entropy/cov_logp_adv"])
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The project's wheel, built from a copy of the working tree's files (tracked, or untracked and not ignored): a
    build in the clone itself would reuse its build/ folder, whose stale files (a module or data file since removed,
    say) would ship."""
    source, folder = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # a tracked file deleted in the working tree is not
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / name, source / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(folder),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    (path,) = folder.glob("trl_entropy-*.whl")
    return zipfile.ZipFile(path)


def test_wheel_installs_kernels_inside_the_package(wheel):
    names = wheel.namelist()
    assert "trl_entropy/kernels/__init__.py" in names
    assert not any(name.startswith("kernels/") for name in names), (
        "a top-level `kernels` module would shadow HF kernels"
    )
    for package in ("core", "methods", "evaluation", "kernels", "toy"):  # every subpackage ships
        assert f"trl_entropy/{package}/__init__.py" in names


def test_wheel_ships_the_demo_configs_and_requires_the_trl_range_the_import_checks(wheel):
    """The demo's per-run YAML configs are package data, every one of them, so an installed package runs the demo as
    a clone does; the wheel's metadata requires TRL in the range `trl_entropy.core.trl.pin` checks at import (setup.py
    reads it from there: tests/unit/test_trl_pin.py)."""
    from packaging.requirements import Requirement

    from trl_entropy.core.trl.pin import TRL_REQUIREMENT
    from trl_entropy.demo.models import CONFIGS_DIR

    folder = "trl_entropy/demo/configs/"
    shipped = {name.removeprefix(folder) for name in wheel.namelist() if name.startswith(folder)}
    assert {"grpo.yaml", "clip_low.yaml", "smollm2/grpo.yaml"} <= shipped and any("+" in name for name in shipped)
    assert shipped == {path.relative_to(CONFIGS_DIR).as_posix() for path in CONFIGS_DIR.rglob("*.yaml")}
    metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    requires = [
        Requirement(line.split(":", 1)[1].strip())
        for line in wheel.read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    assert [(r.specifier, r.marker) for r in requires if r.name == "trl"] == [
        (Requirement(TRL_REQUIREMENT).specifier, None)
    ]


def test_trl_entropy_train_runs_from_the_wheel_outside_the_clone(wheel, tmp_path):
    """`trl-entropy train --method <m>` (the first registered method with a controller: AEnt today) and `trl-entropy
    report` from the wheel installed into a fresh virtual
    environment, run from a folder outside the clone. The environment sees this one's packages (torch, TRL, ...)
    through a path file, which adds their folder but runs none of its path files, so the clone's editable install
    stays out: the trl_entropy imported is the wheel's copy."""
    venv = tmp_path / "venv"
    run_watched([sys.executable, "-m", "venv", "--without-pip", str(venv)], "python -m venv", check=True)
    python = venv / "bin" / "python"
    site_packages = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site_packages / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # --ignore-installed: pip sees the clone's editable install through the path file and would skip the wheel.
    install = [python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "-q", wheel.filename]
    run_watched(install, "pip install of the wheel", check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env |= {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_DISABLED": "true"}

    # Where the package resolves, without importing it (its submodules come from the same folder).
    imported = subprocess.run(
        [python, "-c", "import importlib.util; print(importlib.util.find_spec('trl_entropy').origin)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(imported).is_relative_to(site_packages) and not Path(imported).is_relative_to(ROOT), imported

    # The demo reads its configs from the installed package, the runs the clone's demo has (its configs included).
    from trl_entropy.demo.arguments import DemoArguments

    read = "import json; from trl_entropy.demo.arguments import DemoArguments as D; d = D(); "
    read += "print('DEMO', json.dumps([d.configs_dir, d.methods]))"
    printed = run_watched([python, "-c", read], "the demo's settings read", cwd=elsewhere, env=env, check=True).stdout
    configs_dir, methods = json.loads(printed.rsplit("DEMO ", 1)[1])
    assert Path(configs_dir).is_relative_to(site_packages), configs_dir
    assert methods == DemoArguments().methods

    command = venv / "bin" / "trl-entropy"  # the console script the wheel declares
    method = ADAPTIVE_METHODS[0]
    train = [command, "train", "--method", method, *ONE_STEP_RUN, "--toy_policy_cache", str(TOY_CACHE)]
    trained = run_watched(train, "trl-entropy train from the wheel", cwd=elsewhere, env=env)
    assert trained.returncode == 0, trained.stderr[-4000:]
    assert f"trl-entropy train: saved the model to outputs/{method}-toy" in trained.stderr
    output_dir = elsewhere / "outputs" / f"{method}-toy"
    assert (output_dir / "model.safetensors").is_file()
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    controller_metric = get_method(method).metrics[0].key
    assert any(controller_metric in entry for entry in history)  # the method's trainer ran, not the base's

    report = run_watched(
        [command, "report", str(output_dir)], "trl-entropy report from the wheel", cwd=elsewhere, env=env
    )
    assert report.returncode == 0, report.stderr[-4000:]
    assert (output_dir / "report.png").is_file() and (output_dir / "report.md").is_file()


def installed_closure(requirements) -> set[str]:
    """The distributions a plain install of ``requirements`` pulls in, following each one's own requirements
    (without extras) through the distributions installed here."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen, pending = set(), [Requirement(r) for r in requirements]
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if name in seen or (requirement.marker is not None and not requirement.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            pending.extend(Requirement(r) for r in distribution(name).requires or [])
        except PackageNotFoundError:
            pass
    return seen


def test_a_plain_install_brings_neither_triton_nor_liger(wheel):
    """`pip install -e .` on a CPU machine (torch's CPU build installed first): no Triton, no Liger, no DeepSpeed;
    the `dev` extra brings what the tests need."""
    from packaging.requirements import Requirement

    metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    requirements = [
        line.split(":", 1)[1].strip()
        for line in wheel.read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    plain = [r for r in requirements if "extra ==" not in r]
    dev = {Requirement(r).name for r in requirements if 'extra == "dev"' in r}
    assert torch.version.cuda is None, "this check needs torch's CPU build, which requires no Triton"
    closure = installed_closure(plain)
    assert {"torch", "trl", "transformers", "accelerate", "datasets", "packaging"} <= closure
    assert not closure & {"triton", "liger-kernel", "deepspeed", "peft"}
    assert {"triton", "liger-kernel", "deepspeed", "einops", "pydantic", "peft", "pytest"} <= dev
