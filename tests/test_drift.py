"""The guards against TRL drift (trl_entropy/core/drift.py): a later TRL that renames, re-signs or stops calling a
method the base overrides must fail loudly, naming the TRL version and the method; TRL 1.16 passes both guards."""

import inspect
from importlib.metadata import version

import pytest
from conftest import build_trainer
from trl import GRPOTrainer

from trl_entropy import EntropyGRPOConfig, EntropyGRPOTrainer
from trl_entropy.core.drift import OVERRIDDEN_METHODS, check_trl_methods
from trl_entropy.toy import build_toy_dataset, toy_reward


TRL_VERSION = version("trl")


def owners(name: str) -> list[type]:
    """The classes above our base that define ``name``, nearest first."""
    return [klass for klass in GRPOTrainer.__mro__ if name in vars(klass)]


def short_run(trainer_class, toy_model_path, toy_tokenizer, output_dir, max_steps):
    """A trainer of ``trainer_class`` on the toy task, ready to train ``max_steps`` optimizer steps."""
    args = EntropyGRPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        max_steps=max_steps,
        report_to=[],
        use_cpu=True,
    )
    return trainer_class(
        model=toy_model_path,
        processing_class=toy_tokenizer,
        reward_funcs=toy_reward,
        args=args,
        train_dataset=build_toy_dataset(8),
    )


def test_the_guards_are_silent_on_the_supported_trl(toy_model_path, toy_tokenizer, tmp_path):
    check_trl_methods(EntropyGRPOTrainer)
    trainer = short_run(EntropyGRPOTrainer, toy_model_path, toy_tokenizer, tmp_path, max_steps=1)
    trainer.train()
    assert trainer.loss_path.checked and trainer.loss_path.loss_steps > 0


@pytest.mark.parametrize("name", sorted(OVERRIDDEN_METHODS))
def test_a_method_trl_no_longer_has_fails_at_construction(name, monkeypatch):
    for klass in owners(name):
        monkeypatch.delattr(klass, name)
    with pytest.raises(RuntimeError, match=rf"trl=={TRL_VERSION}: GRPOTrainer no longer has the method {name}\b"):
        check_trl_methods(EntropyGRPOTrainer)


@pytest.mark.parametrize("name", sorted(OVERRIDDEN_METHODS))
def test_a_method_whose_parameters_changed_fails_at_construction(name, monkeypatch):
    def resigned(self, renamed_argument, *args, **kwargs):
        raise AssertionError("never called")

    nearest = owners(name)[0]
    monkeypatch.setattr(nearest, name, resigned)
    with pytest.raises(RuntimeError, match=rf"trl=={TRL_VERSION}: {nearest.__name__}\.{name} now takes"):
        check_trl_methods(EntropyGRPOTrainer)


# Every (method, parameter) the guard checks, from its own table.
PARAMETERS = [(name, parameter) for name, expected in sorted(OVERRIDDEN_METHODS.items()) for parameter in expected]


@pytest.mark.parametrize("name, parameter", PARAMETERS, ids=[f"{n}-{p}" for n, p in PARAMETERS])
def test_renaming_any_guarded_parameter_fails_naming_it(name, parameter, monkeypatch):
    """A TRL whose method renames this one parameter (every other one, later ones included, as installed) fails the
    guard, which names the method, the parameter, what it became and the TRL version."""
    nearest = owners(name)[0]
    signature = inspect.signature(vars(nearest)[name])
    renamed = [
        p.replace(name=f"{p.name}_renamed") if p.name == parameter else p for p in signature.parameters.values()
    ]
    assert [p.name for p in renamed].count(f"{parameter}_renamed") == 1

    def resigned(self, *args, **kwargs):
        raise AssertionError("never called")

    resigned.__signature__ = signature.replace(parameters=renamed)
    monkeypatch.setattr(nearest, name, resigned)
    with pytest.raises(RuntimeError) as error:
        check_trl_methods(EntropyGRPOTrainer)
    message = str(error.value)
    assert f"trl=={TRL_VERSION}: {nearest.__name__}.{name} now takes" in message
    position = OVERRIDDEN_METHODS[name].index(parameter) + 1
    assert f"its parameter {parameter!r} (position {position}) is '{parameter}_renamed'" in message


def test_construction_runs_the_method_check(toy_model_path, toy_tokenizer, tmp_path, monkeypatch):
    monkeypatch.delattr(GRPOTrainer, "_compute_loss")
    with pytest.raises(RuntimeError, match="no longer has the method _compute_loss"):
        build_trainer(EntropyGRPOTrainer, EntropyGRPOConfig, toy_model_path, toy_tokenizer, tmp_path)


class TRLWithAnotherLossPath(GRPOTrainer):
    """A later TRL, simulated: its ``compute_loss`` computes the loss by its own path instead of ``_compute_loss``."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return GRPOTrainer._compute_loss(self, model, inputs)


class DriftedTrainer(EntropyGRPOTrainer, TRLWithAnotherLossPath):
    """Our trainer built on that TRL (its method resolution puts the simulated TRL between us and GRPOTrainer)."""


def test_a_loss_computed_around_ours_fails_the_first_step(toy_model_path, toy_tokenizer, tmp_path):
    trainer = short_run(DriftedTrainer, toy_model_path, toy_tokenizer, tmp_path, max_steps=2)
    with pytest.raises(RuntimeError, match=rf"trl=={TRL_VERSION}: the first training step did not go through"):
        trainer.train()
    assert trainer.state.global_step == 1  # stopped at the first step, not later


def test_every_private_override_of_the_base_is_guarded():
    """The base's overrides of TRL's / Trainer's private methods are exactly the guarded list (a new override must be
    added to the guard), and no other file of the library overrides one."""
    import ast
    from pathlib import Path

    from test_layout import private_overrides

    package = Path(__file__).resolve().parents[1] / "trl_entropy"
    found = {
        path.relative_to(package).as_posix(): private_overrides(ast.parse(path.read_text()))
        for path in package.rglob("*.py")
    }
    assert {name.split(".")[1] for name in found.pop("core/trainer.py")} == set(OVERRIDDEN_METHODS)
    assert {path: names for path, names in found.items() if names} == {}
