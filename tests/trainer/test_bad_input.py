"""Bad input: each gives an error that names the problem, or is handled without corrupting the controllers.

* invalid values for every config field: derived from the field's declared rule (``config_field(valid=Range(...),
  choices=..., none_means=...)``, ``TRL_FIELD_RULES``), and written by hand where a check across fields refuses a value
  the rule accepts (and a check that no field of our configs is left out);
* a ``loss_type`` or another ``GRPOConfig`` option a method does not support;
* a model without an output embedding;
* a train or eval dataset without a ``prompt`` column;
* completions with every token masked;
* NaN (``None``) and infinite rewards.
"""

import dataclasses
import math
import re
from contextlib import nullcontext

import pytest
import torch
import trl.trainer.grpo_trainer
from _support.distributed_run import ADAPTIVE_METHODS, ControllerRecorder, make_rollout, make_trainer, rollout_text
from _support.grpo import make_grpo_batch, toy_config, toy_trainer
from datasets import DatasetDict
from transformers import LlamaModel
from trl import GRPOConfig, GRPOTrainer

from trl_entropy import ADAPOConfig, AEntConfig, ClipCovConfig, EntropyGRPOConfig, ERCConfig, QAEConfig, REPOConfig
from trl_entropy.core.config import EntropyGRPOBaseConfig, Range, Rule, field_rule
from trl_entropy.methods import FIELD_OWNERS, METHODS, get_method
from trl_entropy.methods.aent import aent_coefficient_step
from trl_entropy.toy import build_toy_dataset, build_toy_model, toy_reward


nan, inf = math.nan, math.inf

# ---------------------------------------------------------------------------------------------------------------------
# Config fields
# ---------------------------------------------------------------------------------------------------------------------

# Our configs: the base's and every method's, in the registry's order (the config of every method, EntropyGRPOConfig,
# holds their fields with their rules: test_the_config_of_every_method_checks_each_field_by_its_methods_rule).
CONFIGS = list(dict.fromkeys([EntropyGRPOBaseConfig, *(method.config_class for method in METHODS.values())]))


def declared_rules(config_class) -> dict[str, Rule]:
    """The rules ``config_class`` declares (``config_field``, ``TRL_FIELD_RULES``): the base config's every rule, a
    method config's the rules it adds or redefines (a rule it inherits is tested on the base)."""
    base_fields = EntropyGRPOBaseConfig.__dataclass_fields__
    rules = {}
    for declared in dataclasses.fields(config_class):
        rule = field_rule(config_class, declared.name)
        inherited = field_rule(EntropyGRPOBaseConfig, declared.name) if declared.name in base_fields else None
        if rule is not None and (config_class is EntropyGRPOBaseConfig or rule is not inherited):
            rules[declared.name] = rule
    return rules


def just_outside(end: float, closed: bool, integer: bool, direction: float) -> float:
    """The nearest value beyond ``end`` in ``direction``: the end itself where it does not belong."""
    if not closed:
        return end
    return end + direction if integer else math.nextafter(end, direction * inf)


def refused_by(rule: Rule) -> list:
    """Values ``rule`` refuses, derived from the rule alone. A number: just outside each finite end (the end itself
    where it does not belong), a non-integer where it takes integers, infinity where it takes finite numbers only, NaN,
    a bool and a number written as a string. One of ``choices``: a choice in the wrong case. A flag: a string and the
    int 1. Any: None, where the rule gives None no meaning."""
    values = []
    if rule.flag:
        values += ["yes", 1]
    elif rule.choices is not None:
        values += [choice.swapcase() for choice in rule.choices if choice.swapcase() not in rule.choices]
    else:
        valid = rule.valid
        closed_low, closed_high = valid.ends[0] == "[", valid.ends[1] == "]"
        if valid.low > -inf:
            values.append(just_outside(valid.low, closed_low, valid.integer, -1))
        if valid.high < inf:
            values.append(just_outside(valid.high, closed_high, valid.integer, +1))
        if valid.integer:
            inside = valid.low + 1 if valid.low > -inf else valid.high - 1 if valid.high < inf else 0
            values.append(inside + 0.5)
        if valid.finite:
            values += [inf] + ([-inf] if valid.low == -inf else [])
        values += [nan, True, "1"]
    if rule.none_means is None:
        values.append(None)
    return values


# Written by hand, each with why it is refused: values the field's own rule accepts but a check across fields refuses
# (in the config's __post_init__, after the rules), and the values of a field with no rule. Every other invalid value
# is derived from the field's rule (`refused_by`).
BY_HAND = {
    EntropyGRPOBaseConfig: {
        "entropy_control": [3, []],  # no rule (the registry checks it): not a list of method names; no method
        # Any finite coefficient, as TRL's entropy_coef, but refused where the constant default schedule ignores it.
        "entropy_coef_final": [0.01, 0.0],
        "entropy_coef_warmup_start": [0.01],
    },
    AEntConfig: {
        "aent_coef_init": [1.0],  # outside the default box [1e-5, 3e-3]
        "aent_entropy_low": [0.5],  # above the default aent_entropy_high
        "aent_entropy_high": [0.01],  # below the default aent_entropy_low
        "aent_coef_min": [1.0],  # above the default aent_coef_max
        "aent_coef_max": [1e-6],  # below the default aent_coef_min
        # Under the default constant aent_schedule: a final value, a warm-up or a decay it would ignore.
        "aent_entropy_low_final": [0.01],
        "aent_entropy_high_final": [0.5],
        "aent_coef_min_final": [1e-4],
        "aent_coef_max_final": [1e-3],
        "aent_schedule_warmup_steps": [5],
        "aent_schedule_decay_steps": [5],
        "aent_schedule": ["linear", "cosine"],  # no final value: nothing would move
    },
    ClipCovConfig: {
        "clip_cov_lb": [5.0, 10.0],  # the default clip_cov_ub is 5.0
        "clip_cov_ub": [1.0, 0.5],  # the default clip_cov_lb is 1.0
    },
    REPOConfig: {
        "repo_beta": [0.06, -0.06],  # |0.06| exceeds the default repo_beta_max 0.05
        "repo_beta_min": [0.1],  # above the default repo_beta_max 0.05
        "repo_beta_max": [0, 5e-5],  # below the default repo_beta_min 1e-4
    },
    QAEConfig: {
        "multi_objective_aggregation": ["normalize_then_sum"],  # no group of rewards to take a quantile of
    },
    ADAPOConfig: {
        "adapo_epsilon_high_min": [0.3],  # above the initial epsilon_high 0.28
        "adapo_epsilon_high_max": [0.05, 0.2],  # below adapo_epsilon_high_min 0.1; below the initial epsilon_high
        "epsilon_high": [0.05, 0.9],  # outside [adapo_epsilon_high_min, adapo_epsilon_high_max] = [0.1, 0.5]
        "epsilon": [1.0],  # ADAPO's fixed epsilon_low must lie in [0, 1)
    },
    ERCConfig: {
        "erc_low": [1.0, 1.05],  # 1.0: ratio 1 left out of the band; 1.05: the default erc_high
        "erc_high": [1.0, 0.95],  # 0.95: the default erc_low
    },
}
# (config class, field, value, where the value comes from: the field's rule, or by hand)
INVALID_CASES = [
    (config_class, name, value, "rule")
    for config_class in CONFIGS
    for name, rule in declared_rules(config_class).items()
    for value in refused_by(rule)
] + [
    (config_class, name, value, "by hand")
    for config_class, fields in BY_HAND.items()
    for name, values in fields.items()
    for value in values
]
# TRL fields whose meaning a method replaces: they are the method's own and must be validated as such (TRL's own
# entropy_target keeps TRL's meaning everywhere; REPO's and ADAPO's targets carry their method's prefix).
REDEFINED_TRL_FIELDS = {ADAPOConfig: {"epsilon_high"}}
# TRL's fields whose bad values TRL lets through (or reports with another number), which our configs refuse by the
# rules of core/config.py's TRL_FIELD_RULES: named here too, so that a rule taken out fails a test instead of taking
# its derived cases with it.
STRICTER_TRL_FIELDS = {"num_iterations", "epsilon", "epsilon_high", "beta", "top_entropy_quantile"}


def config(config_class, **options):
    return toy_config(config_class, **options)


@pytest.mark.parametrize(
    "config_class, name, value, source",
    INVALID_CASES,
    ids=[f"{c.__name__}-{n}={v!r}" + ("-by_hand" if source != "rule" else "") for c, n, v, source in INVALID_CASES],
)
def test_invalid_field_value_is_rejected_by_name(config_class, name, value, source):
    with pytest.raises(ValueError, match=re.escape(name)) as error:
        config(config_class, **{name: value})
    assert repr(value) in str(error.value)  # the message names the bad value too


# Rules written here, and the values derived from each, written out.
DERIVED = [
    (Rule(Range(0, 1, "(]")), [0, math.nextafter(1, inf), inf, nan, True, "1", None]),
    (Rule(Range(-1, 1, "[)")), [math.nextafter(-1, -inf), 1, inf, nan, True, "1", None]),
    (Rule(Range(0, ends="(]")), [0, inf, nan, True, "1", None]),
    (Rule(Range(1, integer=True), none_means="(auto)"), [0, 2.5, inf, nan, True, "1"]),
    (Rule(Range()), [inf, -inf, nan, True, "1", None]),
    (Rule(Range(finite=False)), [nan, True, "1", None]),
    (Rule(choices=("auto", "Torch")), ["AUTO", "tORCH", None]),
    (Rule(flag=True), ["yes", 1, None]),
]


@pytest.mark.parametrize(("rule", "expected"), DERIVED, ids=[str(rule) for rule, _ in DERIVED])
def test_the_values_derived_from_a_rule_lie_just_outside_it(rule, expected):
    """The derivation itself, on rules written here: each value is refused, and each end's is its nearest neighbour
    (the nearest float beyond a closed end, the end itself for an open one)."""
    derived = refused_by(rule)
    assert list(map(repr, derived)) == list(map(repr, expected))
    assert not any(rule.accepts(value) for value in derived)
    valid = rule.valid
    if valid is not None:  # the ends that belong are accepted: no valid value lies between them and the derived ones
        ends = ((valid.low, valid.ends[0] == "["), (valid.high, valid.ends[1] == "]"))
        assert all(rule.accepts(end) for end, closed in ends if closed and math.isfinite(end))


@pytest.mark.parametrize("config_class", CONFIGS, ids=lambda c: c.__name__)
def test_a_number_field_without_bounds_has_a_hand_written_case(config_class):
    """A number field whose rule takes every finite number is bounded by other fields (REPO's β by its box) or by
    nothing: the first needs a hand-written cross-field case, the second is a mistake (a loosened ``Range``) unless its
    ``Range`` says why every finite number is valid (``unbounded_because``). Either way, its invalid values cannot be
    derived from its rule."""
    unbounded = [
        name
        for name, rule in declared_rules(config_class).items()
        if rule.valid is not None and rule.valid.low == -inf and rule.valid.high == inf
    ]
    free = {name for name in unbounded if declared_rules(config_class)[name].valid.unbounded_because}
    untested = sorted(set(unbounded) - set(BY_HAND.get(config_class, {})) - free)
    assert not untested, (
        f"{config_class.__name__}: {untested} take every finite number: declare the bounds in config_field "
        "(valid=Range(...)), or, where another field bounds them, add the values that check refuses to BY_HAND"
    )


@pytest.mark.parametrize("method", sorted(METHODS))
def test_eval_batch_of_partial_groups_is_rejected(method):
    spec = get_method(method)
    with pytest.raises(ValueError, match="per_device_eval_batch_size=6") as error:
        config(
            spec.config_class, **spec.defaults, num_generations=4, per_device_eval_batch_size=6, eval_strategy="steps"
        )
    assert "num_generations" in str(error.value)


def test_every_field_of_our_configs_has_an_invalid_value_test():
    trl_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    tested: dict[type, set[str]] = {}
    for config_class, name, _, _ in INVALID_CASES:
        tested.setdefault(config_class, set()).add(name)
    for config_class in {method.config_class for method in METHODS.values()}:
        own = {f.name for f in dataclasses.fields(config_class)} - trl_fields
        own |= REDEFINED_TRL_FIELDS.get(config_class, set()) | STRICTER_TRL_FIELDS
        covered = tested.get(config_class, set()) | tested.get(EntropyGRPOBaseConfig, set())
        assert own <= covered, f"{config_class.__name__}: no invalid-value test for {sorted(own - covered)}"


def test_the_config_of_every_method_checks_each_field_by_its_methods_rule():
    """EntropyGRPOConfig's field of each method carries that method's rule (its range, choices, flag and note), so the
    cases above cover it, and takes None besides: not set, the selected method's default, which a field left at None
    takes when its method is selected."""
    base = EntropyGRPOBaseConfig.__dataclass_fields__
    copies = [name for name in EntropyGRPOConfig.__dataclass_fields__ if name not in base]
    assert copies and set(copies) == set(FIELD_OWNERS)
    for name in copies:
        owner = METHODS[FIELD_OWNERS[name][0]].config_class
        ours, theirs = field_rule(EntropyGRPOConfig, name), field_rule(owner, name)
        assert dataclasses.replace(ours, none_means=None) == dataclasses.replace(theirs, none_means=None), name
        assert ours.none_means == theirs.none_means or theirs.none_means is None and "default" in ours.none_means
        assert EntropyGRPOConfig.__dataclass_fields__[name].default is None
    for name, entry in METHODS.items():
        if entry.config_class is EntropyGRPOBaseConfig:
            continue
        selected = config(EntropyGRPOConfig, entropy_control=[name])
        for item in dataclasses.fields(entry.config_class):
            if item.name in FIELD_OWNERS:
                default = entry.defaults.get(item.name, item.default)
                assert getattr(selected, item.name) == default, (name, item.name)


def test_valid_defaults_are_accepted():
    for method in METHODS.values():
        config(method.config_class, **method.defaults)


# ---------------------------------------------------------------------------------------------------------------------
# Unsupported loss types and GRPOConfig options
# ---------------------------------------------------------------------------------------------------------------------

# Every method × loss-type cell, refused ones included, is tested in tests/trainer/test_loss_types.py.
UNSUPPORTED = [
    ("adapo", {"loss_type": t}, f"ADAPO does not support loss_type='{t}'") for t in ("cispo", "sapo", "vespo")
]
UNSUPPORTED += [("grpo", {"loss_type": "ppo"}, "EntropyGRPO does not support loss_type='ppo'")]
UNSUPPORTED += [
    (name, {"importance_sampling_level": "sequence"}, "importance_sampling_level") for name in ("clip_cov", "kl_cov")
]
UNSUPPORTED += [("kl_cov", {"delta": 2.0}, "delta")]
UNSUPPORTED += [
    (name, options, key)
    for name in (*ADAPTIVE_METHODS, "qae")  # the methods that refuse TRL's entropy bonus next to their own control
    for options, key in (
        ({"entropy_coef": 0.01}, "entropy_coef"),
        ({"use_adaptive_entropy": True}, "use_adaptive_entropy"),
    )
]


@pytest.mark.parametrize("method, options, match", UNSUPPORTED, ids=[f"{m}-{o}" for m, o, _ in UNSUPPORTED])
def test_unsupported_option_is_rejected_by_name(method, options, match):
    spec = get_method(method)
    with pytest.raises(ValueError, match=re.escape(match)):
        config(spec.config_class, **{**spec.defaults, **options})


# ---------------------------------------------------------------------------------------------------------------------
# A model without an output embedding
# ---------------------------------------------------------------------------------------------------------------------


def headless_models(tokenizer):
    causal = build_toy_model(tokenizer)
    causal.get_output_embeddings = lambda: None  # an LM whose head cannot be found
    return {"causal_lm_without_head": causal, "bare_backbone": LlamaModel(build_toy_model(tokenizer).config)}


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("kind", ["causal_lm_without_head", "bare_backbone"])
def test_model_without_output_embedding_is_rejected(method, kind, toy_tokenizer, tmp_path):
    spec = get_method(method)
    args = spec.config_class(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        report_to=[],
        use_cpu=True,
        **spec.defaults,
    )
    with pytest.raises(ValueError, match="no output embedding"):
        spec.trainer_class(
            model=headless_models(toy_tokenizer)[kind],
            reward_funcs=toy_reward,
            args=args,
            train_dataset=build_toy_dataset(8),
            processing_class=toy_tokenizer,
        )


# ---------------------------------------------------------------------------------------------------------------------
# A dataset without a prompt column
# ---------------------------------------------------------------------------------------------------------------------


def prompt_datasets():
    """Datasets by kind: the toy task's (standard prompts), the same with its prompts under another name, and both as
    iterable datasets whose columns are declared, or unknown (after a ``map``, the first example shows them)."""
    good = build_toy_dataset(8, seed=0)
    bad = good.rename_column("prompt", "question")
    conversational = good.map(lambda row: {"prompt": [{"role": "user", "content": row["prompt"]}]})
    return {
        "good": good,
        "bad": bad,
        "conversational": conversational,
        "good_iterable_unknown_columns": good.to_iterable_dataset().map(lambda row: row),
        "bad_iterable": bad.to_iterable_dataset(),
        "bad_iterable_unknown_columns": bad.to_iterable_dataset().map(lambda row: row),
    }


# (train dataset, eval dataset: a kind, or {name: kind} for a dict of them, or None; what the error names)
MISSING_PROMPT = {
    "train": ("bad", None, "train_dataset"),
    "train_iterable": ("bad_iterable", None, "train_dataset"),
    "train_iterable_unknown_columns": ("bad_iterable_unknown_columns", None, "train_dataset"),
    "eval": ("good", "bad", "eval_dataset"),
    "eval_iterable": ("good", "bad_iterable", "eval_dataset"),
    "eval_dict": ("good", {"held_out": "good", "math": "bad"}, "eval_dataset['math']"),
    "eval_dataset_dict": ("good", DatasetDict, "eval_dataset['test']"),
}
WITH_PROMPT = {
    "standard": ("good", None),
    "conversational": ("conversational", "conversational"),
    "iterable_unknown_columns": ("good_iterable_unknown_columns", "good_iterable_unknown_columns"),
    "eval_dict": ("good", {"held_out": "good", "chat": "conversational"}),
}


def datasets_of(train, evaluation):
    kinds = prompt_datasets()
    if evaluation is DatasetDict:
        return kinds[train], DatasetDict(test=kinds["bad"])
    if isinstance(evaluation, dict):
        return kinds[train], {name: kinds[kind] for name, kind in evaluation.items()}
    return kinds[train], None if evaluation is None else kinds[evaluation]


def grpo_trainer(tokenizer, output_dir, train_dataset, eval_dataset=None, **keyword):
    # An iterable train set has no length: max_steps is required (transformers).
    args = toy_config(EntropyGRPOConfig, output_dir, per_device_train_batch_size=8, num_generations=4, max_steps=1)
    return toy_trainer(
        get_method("grpo").trainer_class,
        args,
        build_toy_model(tokenizer),
        tokenizer,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        **keyword,
    )


@pytest.mark.parametrize("case", sorted(MISSING_PROMPT))
def test_dataset_without_a_prompt_column_is_rejected_at_construction(case, toy_tokenizer, tmp_path):
    """TRL itself fails only at the first generation, with a bare ``KeyError: 'prompt'``."""
    train, evaluation, name = MISSING_PROMPT[case]
    with pytest.raises(ValueError) as error:
        grpo_trainer(toy_tokenizer, tmp_path, *datasets_of(train, evaluation))
    message = str(error.value)
    assert message.startswith(f"{name} has no 'prompt' column (its columns: ['question', 'answer']).")
    assert "(standard format)" in message and "(conversational format)" in message
    assert "rename_column('question', 'prompt')" in message


@pytest.mark.parametrize("case", sorted(WITH_PROMPT))
def test_dataset_with_a_prompt_column_is_accepted(case, toy_tokenizer, tmp_path):
    train, evaluation = WITH_PROMPT[case]
    trainer = grpo_trainer(toy_tokenizer, tmp_path, *datasets_of(train, evaluation))
    first = next(iter(trainer.train_dataset))  # reading the columns of an iterable dataset consumes nothing
    assert first["prompt"] == next(iter(prompt_datasets()[train]))["prompt"]


def test_an_environment_supplies_the_prompts_without_a_prompt_column(toy_tokenizer, tmp_path, monkeypatch):
    """With ``environment_factory`` TRL takes each prompt from the environment's ``reset()``, so no column is needed.
    (The toy tokenizer's chat template cannot render tool calls, which TRL checks first.)"""

    class Environment:
        def reset(self, **kwargs):
            return "1+1="

    monkeypatch.setattr(trl.trainer.grpo_trainer, "supports_tool_calling", lambda processing_class: True)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    trainer = grpo_trainer(toy_tokenizer, tmp_path, prompt_datasets()["bad"], environment_factory=Environment)
    assert trainer.environment_factories is not None


# ---------------------------------------------------------------------------------------------------------------------
# Completions with every token masked
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", sorted(METHODS))
def test_all_masked_micro_batch_gives_a_finite_loss_and_holds_the_controllers(
    method, toy_model_path, toy_tokenizer, tmp_path
):
    trainer = make_trainer(method, toy_model_path, str(tmp_path), rollout=None)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    before = {name: c.state_dict() for name, c in trainer.controllers.items()}
    inputs = make_grpo_batch(trainer.model, len(toy_tokenizer), batch=4, seed=5)
    inputs["completion_mask"].zero_()
    inputs["num_items_in_batch"] = inputs["completion_mask"].sum()
    with pytest.warns(UserWarning, match="keeps its value") if trainer.controllers else nullcontext():
        loss = trainer.compute_loss(trainer.model, inputs)
    assert torch.isfinite(loss) and loss.item() == 0.0
    loss.backward()
    for name, parameter in trainer.model.named_parameters():
        assert parameter.grad is None or not parameter.grad.any(), name
    assert {name: c.state_dict() for name, c in trainer.controllers.items()} == before


def masked_first_step_rollout():
    """Step 1: every completion truncated (no <eos>), hence masked by mask_truncated_completions; then normal ones."""
    truncated, normal = make_rollout(lengths=(8, 8, 8, 8), eos=False), make_rollout()

    def rollout(prompts, trainer):
        return (truncated if trainer.state.global_step == 0 else normal)(prompts, trainer)

    return rollout


@pytest.mark.parametrize("method", ADAPTIVE_METHODS)
def test_training_through_an_all_masked_step(method, warm_toy_policy_path, tmp_path):
    trainer = make_trainer(
        method,
        warm_toy_policy_path,
        str(tmp_path),
        rollout=masked_first_step_rollout(),
        max_steps=2,
        max_completion_length=8,
        mask_truncated_completions=True,
    )
    (controller,) = trainer.controllers.values()
    initial = controller.state_dict()
    recorder = ControllerRecorder.attached_to(trainer)
    with pytest.warns(UserWarning, match="keeps its value"):
        trainer.train()
    history = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["completions/clipped_ratio"] for entry in history] == [1.0, 0.0]
    assert history[0]["loss"] == 0.0 and all(math.isfinite(entry["loss"]) for entry in history)
    assert recorder.values[0] == controller_value_of(initial, controller)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    # Step 2 updates the controller from step 2's statistic alone, as if step 1 had not happened.
    mean = history[1]["entropy/clamped" if method == "aent" else "entropy"]
    state = controller.state_dict()
    if method == "entropic":  # moved at step 2's one micro-batch (a whole cycle, w = 1) from the integral held at 0
        args = trainer.args
        error = mean - args.entropic_target
        assert state["alpha"] == pytest.approx(min(max(args.entropic_kp * error, -1.0), 1.0), rel=1e-5)
        assert state["integral"] == pytest.approx(error, rel=1e-5)
    elif method == "aent":
        args = trainer.args
        expected = aent_coefficient_step(
            args.aent_coef_init,
            mean,
            args.aent_entropy_low,
            args.aent_entropy_high,
            args.aent_coef_lr,
            args.aent_coef_min,
            args.aent_coef_max,
        )
        assert state["coef"] == pytest.approx(expected, rel=1e-5)
    else:
        assert initial["entropy_target"] is None
        assert state["entropy_target"] == pytest.approx(mean, rel=1e-5)  # measured at the first step with tokens


def controller_value_of(state, controller):
    values = {"aent": state.get("coef"), "repo": state.get("beta"), "adapo": state.get("epsilon_high")}
    return {**values, "entropic": state.get("alpha")}[controller.name]


# ---------------------------------------------------------------------------------------------------------------------
# NaN and infinite rewards
# ---------------------------------------------------------------------------------------------------------------------


def reward_with(bad_value, rows):
    def bad_reward(completions, answer, **kwargs):
        rewards = toy_reward(completions, answer)
        for row in rows:
            rewards[row] = bad_value
        return rewards

    return bad_reward


@pytest.mark.parametrize("value", [inf, -inf])
@pytest.mark.parametrize("method", ["grpo", *ADAPTIVE_METHODS])
def test_infinite_reward_is_rejected_naming_the_function(method, value, warm_toy_policy_path, tmp_path):
    trainer = make_trainer(method, warm_toy_policy_path, str(tmp_path), max_steps=1)
    trainer.reward_funcs = [reward_with(value, [5])]
    trainer.reward_func_names = ["bad_reward"]
    before = {name: c.state_dict() for name, c in trainer.controllers.items()}
    with pytest.raises(ValueError, match=rf"reward function 'bad_reward' returned {value} for completion 5"):
        trainer.train()
    assert {name: c.state_dict() for name, c in trainer.controllers.items()} == before
    assert trainer.state.global_step == 0


def scored(trainer, inputs):
    trainer.model.train()
    with torch.no_grad():
        return trainer._generate_and_score_completions([dict(row) for row in inputs])


@pytest.mark.parametrize("method", ADAPTIVE_METHODS)
def test_none_and_nan_rewards_are_handled_as_trl_does(method, warm_toy_policy_path, tmp_path):
    """None and NaN rewards mark a completion unscorable (TRL): no advantage, no effect on the controllers."""

    def partial_reward(completions, answer, **kwargs):
        rewards = toy_reward(completions, answer)
        rewards[0:4] = [None] * 4  # a whole group unscorable
        rewards[5] = math.nan  # one completion of the second group
        return rewards

    ours = make_trainer(method, warm_toy_policy_path, str(tmp_path / "ours"), max_steps=2)
    ours.reward_funcs, ours.reward_func_names = [partial_reward], ["partial_reward"]
    trl_args = toy_config(
        GRPOConfig, tmp_path / "trl", per_device_train_batch_size=8, num_generations=4, max_completion_length=8
    )
    reference = toy_trainer(
        GRPOTrainer,
        trl_args,
        warm_toy_policy_path,
        reward_funcs=partial_reward,
        train_dataset=build_toy_dataset(16),
        rollout_func=make_rollout(),
    )
    dataset = build_toy_dataset(16, seed=0)

    def mixed(row):  # copies 0, 2 and 3 (copy 1 gets NaN) of the second group are not all right or all wrong
        return len({toy_reward([rollout_text(row["prompt"], k)], [row["answer"]])[0] for k in (0, 2, 3)}) == 2

    second = next(row for row in list(dataset)[1:] if mixed(row))
    inputs = [dataset[0]] * 4 + [second] * 4
    advantages = scored(ours, inputs)["advantages"]
    torch.testing.assert_close(advantages, scored(reference, inputs)["advantages"])
    assert torch.isfinite(advantages).all()
    assert advantages[:4].eq(0).all() and advantages[5] == 0 and advantages[4:].ne(0).any()

    recorder = ControllerRecorder.attached_to(ours)
    ours.train()
    assert len(recorder.values) == 2 and all(math.isfinite(v) for v in recorder.values)
    for controller in ours.controllers.values():
        assert all(v is None or math.isfinite(v) for v in controller.state_dict().values() if not isinstance(v, int))
    assert all(torch.isfinite(p).all() for p in ours.model.parameters())
    assert all(math.isfinite(entry["loss"]) for entry in ours.state.log_history if "loss" in entry)
