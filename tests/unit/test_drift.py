"""The guards against TRL drift (trl_entropy/core/trl/drift.py): a later TRL that renames, re-signs or stops calling a
private name that core/trl/bridge.py uses must fail loudly, naming the TRL version and the name; TRL 1.16 passes every
guard. One case per name of the guard's table, a check that the table is exactly what the bridge uses, and the check of
the pass whose entropy is the rollout policy's."""

import ast
import inspect
from importlib.metadata import version

import pytest
from _support.grpo import toy_trainer
from trl import GRPOConfig, GRPOTrainer

from trl_entropy import EntropyGRPOConfig, EntropyGRPOTrainer
from trl_entropy.core.batch import OLD_ENTROPY_KEY
from trl_entropy.core.trl.bridge import TRLBridge, grpo_citation
from trl_entropy.core.trl.drift import (
    INSTANCE_ATTRIBUTES,
    OVERRIDES,
    PASS_AT_K_NAMES,
    PRIVATE_NAMES,
    check_class,
    check_trainer,
)
from trl_entropy.evaluation import count_correct
from trl_entropy.toy import build_toy_dataset


TRL_VERSION = version("trl")
METHODS = sorted(name for name, private in PRIVATE_NAMES.items() if private.kind == "method")


def owners(name: str) -> list[type]:
    """The classes above our bridge that define ``name``, nearest first."""
    return [klass for klass in GRPOTrainer.__mro__ if name in vars(klass)]


def rename_in_trl(monkeypatch, name: str) -> None:
    """Simulate a TRL that renamed the class-level ``name`` (every class above the bridge that defines it)."""
    for klass in owners(name):
        monkeypatch.setattr(klass, f"{name}_renamed", vars(klass)[name], raising=False)
        monkeypatch.delattr(klass, name)


def short_run(
    trainer_class, toy_model_path, toy_tokenizer, output_dir, max_steps, config_class=EntropyGRPOConfig, **options
):
    """A trainer of ``trainer_class`` on the toy task, ready to train ``max_steps`` optimizer steps."""
    args = config_class(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        max_steps=max_steps,
        report_to=[],
        use_cpu=True,
        **options,
    )
    return toy_trainer(trainer_class, args, toy_model_path, toy_tokenizer, train_dataset=build_toy_dataset(8))


@pytest.fixture(scope="module")
def trl_trainer(toy_model_path, toy_tokenizer, tmp_path_factory):
    """A plain ``trl.GRPOTrainer`` (pass@k samples with any GRPO trainer)."""
    return short_run(GRPOTrainer, toy_model_path, toy_tokenizer, tmp_path_factory.mktemp("trl"), 1, GRPOConfig)


def assert_loud(error: pytest.ExceptionInfo, name: str) -> None:
    message = str(error.value)
    assert f"trl=={TRL_VERSION}: " in message
    assert f" {name}," in message or f" {name})" in message or f".{name} now takes" in message, message


def test_the_guards_are_silent_on_the_supported_trl(toy_model_path, toy_tokenizer, tmp_path, trl_trainer):
    check_class(EntropyGRPOTrainer, TRLBridge)
    check_trainer(trl_trainer, INSTANCE_ATTRIBUTES + PASS_AT_K_NAMES)
    assert grpo_citation().startswith("@article{")
    trainer = short_run(EntropyGRPOTrainer, toy_model_path, toy_tokenizer, tmp_path, max_steps=1)
    trainer.train()
    assert trainer.loss_path.checked and trainer.loss_path.loss_steps > 0


@pytest.mark.parametrize("name", sorted(PRIVATE_NAMES))
def test_every_private_name_trl_renamed_fails_loudly_naming_it(name, monkeypatch, trl_trainer):
    """Each name of the guard's table, renamed in TRL, fails where the table says it is checked, naming it and the
    TRL version."""
    private = PRIVATE_NAMES[name]
    if private.kind == "attribute":  # set by TRL's __init__: checked on the trainer
        monkeypatch.setattr(trl_trainer, f"{name}_renamed", getattr(trl_trainer, name), raising=False)
        monkeypatch.delattr(trl_trainer, name)
        with pytest.raises(RuntimeError) as error:
            check_trainer(trl_trainer, INSTANCE_ATTRIBUTES)
        assert f"GRPOTrainer no longer sets the attribute {name}," in str(error.value)
    else:
        rename_in_trl(monkeypatch, name)
        with pytest.raises(RuntimeError) as error:
            check_class(EntropyGRPOTrainer, TRLBridge) if private.checked == "construction" else grpo_citation()
        assert f"GRPOTrainer no longer has the {private.kind} {name}," in str(error.value)
    assert_loud(error, name)
    assert "trl_entropy/core/trl/bridge.py" in str(error.value)


@pytest.mark.parametrize("name", METHODS)
def test_a_method_trl_no_longer_has_fails_at_construction(name, monkeypatch):
    for klass in owners(name):
        monkeypatch.delattr(klass, name)
    with pytest.raises(RuntimeError, match=rf"trl=={TRL_VERSION}: GRPOTrainer no longer has the method {name}\b"):
        check_class(EntropyGRPOTrainer, TRLBridge)


@pytest.mark.parametrize("name", METHODS)
def test_a_method_whose_parameters_changed_fails_at_construction(name, monkeypatch):
    def resigned(self, renamed_argument, *args, **kwargs):
        raise AssertionError("never called")

    nearest = owners(name)[0]
    monkeypatch.setattr(nearest, name, resigned)
    with pytest.raises(RuntimeError, match=rf"trl=={TRL_VERSION}: {nearest.__name__}\.{name} now takes"):
        check_class(EntropyGRPOTrainer, TRLBridge)


# The parameters core/trl/bridge.py calls or overrides each of TRL's private methods with (TRL 1.16), stated here, not
# read from the guard's table: a table trimmed to fewer parameters would guard less, and a test reading it would pass.
BRIDGE_PARAMETERS = {
    "_calculate_rewards": ("inputs", "prompts", "completions", "completion_ids_list"),
    "_compute_loss": ("model", "inputs"),
    "_generate_and_score_completions": ("inputs",),
    "_generate_single_turn": ("prompt_ids", "images", "multimodal_fields", "num_generations"),
    "_get_output_dir": ("trial",),
    "_get_per_token_logps_and_entropies": (
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
        "compute_aux_loss",
    ),
    "_load_from_checkpoint": ("resume_from_checkpoint", "model"),
    "_load_optimizer_and_scheduler": ("checkpoint",),
    "_save_checkpoint": ("model", "trial"),
    "_tokenize_prompts": ("prompts",),
}


def named_parameters(function) -> tuple[str, ...]:
    """The parameters of ``function`` after ``self``, by name (``*args`` and ``**kwargs`` left out)."""
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    parameters = list(inspect.signature(function).parameters.values())[1:]
    return tuple(parameter.name for parameter in parameters if parameter.kind not in variadic)


def test_the_guard_checks_every_parameter_the_bridge_relies_on():
    """The guard's table holds, for every private method, the parameters stated above, and the bridge's own overrides
    take exactly those."""
    assert {name: PRIVATE_NAMES[name].parameters for name in METHODS} == BRIDGE_PARAMETERS
    overridden = sorted(set(BRIDGE_PARAMETERS) & set(vars(TRLBridge)))
    assert overridden, "the bridge overrides none of them: the second check would be empty"
    for name in overridden:
        assert named_parameters(vars(TRLBridge)[name]) == BRIDGE_PARAMETERS[name], name


# Every (method, parameter) the guard must check.
PARAMETERS = [(name, parameter) for name, parameters in BRIDGE_PARAMETERS.items() for parameter in parameters]


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
        check_class(EntropyGRPOTrainer, TRLBridge)
    message = str(error.value)
    assert f"trl=={TRL_VERSION}: {nearest.__name__}.{name} now takes" in message
    position = BRIDGE_PARAMETERS[name].index(parameter) + 1
    assert f"its parameter {parameter!r} (position {position}) is '{parameter}_renamed'" in message


def test_construction_runs_the_method_check(monkeypatch, toy_trainer_of):
    monkeypatch.delattr(GRPOTrainer, "_compute_loss")
    with pytest.raises(RuntimeError, match="no longer has the method _compute_loss"):
        toy_trainer_of("grpo")


@pytest.mark.parametrize("name", ["_logs", "_pending_metrics"])
def test_construction_runs_the_attribute_check(name, monkeypatch, toy_trainer_of):
    """An attribute TRL's ``__init__`` no longer sets fails the construction of our trainer, naming it."""
    trl_init = GRPOTrainer.__init__

    def init_without(self, *args, **kwargs):
        trl_init(self, *args, **kwargs)
        delattr(self, name)

    monkeypatch.setattr(GRPOTrainer, "__init__", init_without)
    with pytest.raises(RuntimeError, match=rf"trl=={TRL_VERSION}: GRPOTrainer no longer sets the attribute {name},"):
        toy_trainer_of("grpo")


@pytest.mark.parametrize("name", PASS_AT_K_NAMES)
def test_pass_at_k_checks_its_names_at_first_use(name, monkeypatch, trl_trainer):
    """pass@k on a plain trl.GRPOTrainer whose TRL renamed one of the names it uses fails before sampling."""
    if PRIVATE_NAMES[name].kind == "attribute":
        monkeypatch.delattr(trl_trainer, name)
    else:
        rename_in_trl(monkeypatch, name)
    with pytest.raises(RuntimeError) as error:
        count_correct(trl_trainer, build_toy_dataset(2), num_samples=2)
    assert_loud(error, name)


def test_the_cards_citation_checks_grpos_paper(monkeypatch):
    """TRL's ``_BaseTrainer`` has a ``_paper`` of its own (empty): GRPO's going missing must not pass unnoticed."""
    monkeypatch.delattr(GRPOTrainer, "_paper")
    with pytest.raises(
        RuntimeError, match=rf"trl=={TRL_VERSION}: GRPOTrainer no longer has the class attribute _paper,"
    ):
        grpo_citation()


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


def test_the_guard_lists_exactly_the_private_names_the_bridge_uses():
    """The guard's table is the set of TRL's and Trainer's private names core/trl/bridge.py touches (read from its
    source), so a new private use cannot slip past the guard; its overrides are the names the table says it
    overrides. tests/unit/test_layout.py checks that no other file touches any."""
    from test_layout import TRL_BRIDGE, tree, trl_private_uses

    bridge = tree(TRL_BRIDGE)
    assert set(trl_private_uses(bridge)) == set(PRIVATE_NAMES)
    (bridge_class,) = [node for node in bridge.body if isinstance(node, ast.ClassDef) and node.name == "TRLBridge"]
    overridden = {item.name for item in bridge_class.body if isinstance(item, ast.FunctionDef)} & set(PRIVATE_NAMES)
    assert overridden == {name for name, private in PRIVATE_NAMES.items() if private.use in OVERRIDES}


# ---------------------------------------------------------------------------------------------------------------------
# The rollout entropy: read off the pass that computes TRL's rollout log-probs
# ---------------------------------------------------------------------------------------------------------------------


class RolloutEntropyTrainer(EntropyGRPOTrainer):
    """The base with a method's declaration that it reads the rollout policy's entropy."""

    needs_rollout_entropy = True


class TRLWithAnotherRolloutPath(GRPOTrainer):
    """A later TRL, simulated: its rollout log-probs reach the generation batch by another path than the scoring
    method our bridge overrides (here: a copy of them), or not at all where its rule still says off-policy."""

    drop = False

    def _generate_and_score_completions(self, inputs):
        output = GRPOTrainer._generate_and_score_completions(self, inputs)
        old_log_probs = output.pop("old_per_token_logps")
        if not self.drop:
            output["old_per_token_logps"] = old_log_probs.clone()
        return output


class DriftedRolloutTrainer(RolloutEntropyTrainer, TRLWithAnotherRolloutPath):
    """Our trainer built on that TRL."""


def rollout_run(trainer_class, toy_model_path, toy_tokenizer, output_dir, num_iterations=2):
    # beta > 0: a reference model's scoring call too
    return short_run(
        trainer_class, toy_model_path, toy_tokenizer, output_dir, 2, num_iterations=num_iterations, beta=0.04
    )


@pytest.mark.parametrize("num_iterations", [1, 2], ids=["on_policy", "off_policy"])
def test_the_rollout_entropy_check_is_silent_on_the_supported_trl(
    num_iterations, toy_model_path, toy_tokenizer, tmp_path
):
    trainer = rollout_run(RolloutEntropyTrainer, toy_model_path, toy_tokenizer, tmp_path, num_iterations)
    trainer.train()
    (batch,) = trainer.buffered_generation_batch
    assert (OLD_ENTROPY_KEY in batch) == (num_iterations > 1) == ("old_per_token_logps" in batch)


@pytest.mark.parametrize("drop", [False, True], ids=["another_path", "missing"])
def test_rollout_log_probs_from_another_path_fail_loudly(drop, toy_model_path, toy_tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(TRLWithAnotherRolloutPath, "drop", drop)
    trainer = rollout_run(DriftedRolloutTrainer, toy_model_path, toy_tokenizer, tmp_path)
    problem = "without old_per_token_logps where TRL's rule" if drop else "did not come from _get_per_token_logps"
    with pytest.raises(RuntimeError, match=rf"trl=={TRL_VERSION}: .*{problem}") as error:
        trainer.train()
    assert "trl_entropy/core/trl/bridge.py" in str(error.value)
    assert trainer.state.global_step == 0  # before the first update
