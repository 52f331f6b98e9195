"""The config fields' rules (``core.config``: ``Range``, ``Rule``, ``config_field``) and their one validator.

* ``Range`` and ``Rule`` on their edges: open and closed ends, integers, infinities, NaN, bools, None.
* Every registered config rejects, by name, a bad value generated from each of its fields' rules; the hand-picked bad
  values of tests/trainer/test_bad_input.py stay the independent check of the rules themselves.
* The rules stay out of what TRL's parser sees: every config parses from the command line and from a YAML file.
"""

import dataclasses
import math
import re
import sys

import pytest
import yaml
from _support.grpo import toy_config
from trl import GRPOConfig, TrlParser

from trl_entropy.core.bounds import ScheduledBounds, ScheduledCoefficient
from trl_entropy.core.config import FIELD_RULES, STRICTER, TRL_FIELD_RULES, Range, Rule, config_field, field_rule
from trl_entropy.methods import SPECS


nan, inf = math.nan, math.inf

# (range, value, accepted)
RANGE_CASES = [
    (Range(0, 1, "[)"), 0, True),
    (Range(0, 1, "[)"), 0.999, True),
    (Range(0, 1, "[)"), 1, False),
    (Range(0, 1, "(]"), 0, False),
    (Range(0, 1, "(]"), 1.0, True),
    (Range(0, 1, "()"), 0.5, True),
    (Range(0, 1, "()"), 1e-12, True),
    (Range(0, 1, "()"), 1, False),
    (Range(0), 0.0, True),
    (Range(0), -1e-300, False),
    (Range(0), inf, False),
    (Range(0), nan, False),
    (Range(0), True, False),
    (Range(0), "1", False),
    (Range(0), None, False),
    (Range(1, integer=True), 1, True),
    (Range(1, integer=True), 1.0, False),
    (Range(1, integer=True), 0, False),
    (Range(1, integer=True), True, False),
    (Range(), -1e300, True),
    (Range(), -inf, False),
    (Range(finite=False), -inf, True),
    (Range(finite=False), inf, True),
    (Range(finite=False), nan, False),
    (Range(finite=False), "x", False),
]


@pytest.mark.parametrize("valid, value, accepted", RANGE_CASES, ids=[f"{r}:{v!r}" for r, v, _ in RANGE_CASES])
def test_range_holds(valid, value, accepted):
    assert valid.holds(value) is accepted


@pytest.mark.parametrize(
    "valid, said",
    [
        (Range(0, 1, "[)"), "a finite number in [0, 1)"),
        (Range(0, ends="(]"), "a finite number > 0"),
        (Range(high=2, ends="[)"), "a finite number < 2"),
        (Range(1, integer=True), "an integer >= 1"),
        (Range(), "a finite number"),
        (Range(finite=False), "a number (infinities allowed)"),
    ],
)
def test_range_says_what_it_holds(valid, said):
    assert str(valid) == said


def test_rule_message_names_the_field_the_value_and_the_rule():
    rule = Rule(Range(0), none_means="(measured)", note="(why)")
    rule.check("target", None)
    rule.check("target", 2.0)
    with pytest.raises(
        ValueError, match=re.escape("target=-1.0 is invalid: it must be a finite number >= 0, or None")
    ):
        rule.check("target", -1.0)
    with pytest.raises(ValueError, match=re.escape("it must be one of ['a', 'b'].")):
        Rule(choices=("a", "b")).check("pick", "c")
    with pytest.raises(ValueError, match=re.escape("flag='yes' is invalid: it must be True or False.")):
        Rule(flag=True).check("flag", "yes")
    assert not Rule(choices=("a", "b")).accepts(None) and not Rule(flag=True).accepts(None)


def test_config_field_keeps_the_rule_out_of_the_metadata():
    """TRL's parser hands every metadata key to argparse: only ``help`` and ``choices`` may be there."""
    plain, ranged, picked, flag = (
        config_field(1.0, "help"),
        config_field(1.0, "help", valid=Range(0)),
        config_field("a", "help", choices=("a", "b")),
        config_field(True, "help"),
    )
    assert dict(plain.metadata) == dict(ranged.metadata) == dict(flag.metadata) == {"help": "help"}
    assert dict(picked.metadata) == {"help": "help", "choices": ["a", "b"]}
    assert plain not in FIELD_RULES and FIELD_RULES[ranged] == Rule(Range(0))
    assert FIELD_RULES[picked] == Rule(choices=("a", "b")) and FIELD_RULES[flag] == Rule(flag=True)


# ---------------------------------------------------------------------------------------------------------------------
# Every registered config, a bad value per rule
# ---------------------------------------------------------------------------------------------------------------------

CONFIGS = sorted({spec.config_class for spec in SPECS}, key=lambda config_class: config_class.__name__)


def bad_values(rule: Rule) -> list:
    """Values ``rule`` refuses: past each finite end, NaN, a bool and a string; None where it means nothing."""
    if rule.flag:
        values = ["yes", 1]
    elif rule.choices is not None:
        values = ["not-a-choice", rule.choices[0].upper(), rule.choices[0].lower()]
    else:
        valid = rule.valid
        values = [nan, True, "1"]
        for end, step in ((valid.low, -1), (valid.high, 1)):
            if math.isfinite(end):
                values.append(end if (valid.ends[0] if step < 0 else valid.ends[1]) in "()" else end + step * 0.5)
        if valid.finite:
            values.append(inf)
        if valid.integer:
            values.append(max(valid.low, 0) + 1.5)
    if rule.none_means is None:
        values.append(None)
    return [value for value in values if not rule.accepts(value)]


RULED_FIELDS = [
    (config_class, f.name)
    for config_class in CONFIGS
    for f in dataclasses.fields(config_class)
    if field_rule(config_class, f.name) is not None
]
BAD_CASES = [
    (config_class, name, value)
    for config_class, name in RULED_FIELDS
    for value in bad_values(field_rule(config_class, name))
]


def test_every_rule_yields_bad_values():
    """The generator covers every rule (a rule it cannot break would test nothing)."""
    for config_class, name in RULED_FIELDS:
        assert bad_values(field_rule(config_class, name)), (config_class.__name__, name)
    ruled = {name for _, name in RULED_FIELDS}
    assert set(TRL_FIELD_RULES) - {"epsilon_high"} <= ruled
    assert {"entropy_kernel_chunk_size", "clip_cov_lb", "qae_quantile_k", "aent_adaptive"} <= ruled


@pytest.mark.parametrize(
    "config_class, name, value", BAD_CASES, ids=[f"{c.__name__}-{n}={v!r}" for c, n, v in BAD_CASES]
)
def test_a_value_against_the_rule_is_refused_by_name(config_class, name, value):
    with pytest.raises(ValueError) as error:
        toy_config(config_class, **{name: value})
    message = str(error.value)
    assert f"{name}={value!r} is invalid: it must be {field_rule(config_class, name)}." in message


def test_trl_fields_say_the_check_is_stricter_than_trl():
    with pytest.raises(
        ValueError, match=re.escape(f"num_iterations=0 is invalid: it must be an integer >= 1 {STRICTER}")
    ):
        toy_config(CONFIGS[0], num_iterations=0)


# ---------------------------------------------------------------------------------------------------------------------
# TRL's parser
# ---------------------------------------------------------------------------------------------------------------------


def own_settings(config_class) -> dict[str, str]:
    """Each flag and choice of the config that TRL's GRPOConfig lacks, set to a valid non-default value."""
    settings = {}
    for f in dataclasses.fields(config_class):
        if f.name in GRPOConfig.__dataclass_fields__:
            continue
        rule = field_rule(config_class, f.name)
        if rule is not None and rule.flag:
            settings[f.name] = str(not f.default)
        elif rule is not None and rule.choices:
            settings[f.name] = rule.choices[-1]
    if settings.get("entropy_coef_schedule", "constant") != "constant":  # a decaying schedule needs its final value
        settings["entropy_coef_final"] = "0.0"
    # A method's scheduled bounds and coefficients (declared beside its config): a moving schedule needs a final
    # value (and the bounds their flag).
    for declared in vars(sys.modules[config_class.__module__]).values():
        if (
            isinstance(declared, ScheduledCoefficient)
            and settings.get(f"{declared.name}_schedule", "constant") != "constant"
        ):
            settings[f"{declared.name}_final"] = "0.0"
    for bounds in vars(sys.modules[config_class.__module__]).values():
        if isinstance(bounds, ScheduledBounds) and settings.get(bounds.kind, "constant") != "constant":
            last = bounds.bounds[-1]
            settings[f"{last}_final"] = str(config_class.__dataclass_fields__[last].default)
            settings[bounds.needs] = "True"
    return settings


@pytest.mark.parametrize("config_class", CONFIGS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("source", ["command line", "yaml"])
def test_every_config_parses_with_trl_parser(config_class, source, tmp_path):
    settings = {"output_dir": str(tmp_path), "use_cpu": "True", "bf16": "False", "report_to": "none"}
    settings |= own_settings(config_class)
    parser = TrlParser((config_class,))
    if source == "yaml":
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(settings))
        (config,) = parser.parse_args_and_config(args=["--config", str(path)])
    else:
        (config,) = parser.parse_args_and_config(
            args=[arg for item in settings.items() for arg in (f"--{item[0]}", item[1])]
        )
    assert type(config) is config_class
    for name, value in own_settings(config_class).items():
        assert str(getattr(config, name)) == value, name
