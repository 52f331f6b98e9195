"""Methods combined on the command line and in YAML: `--method NAME+NAME` and `entropy_control: [NAME, NAME]` build the
combination's config with both methods' options (in `--help` too), and every malformed combination is a usage error
that says what to change. In Python: unknown, empty, repeated and foreign settings are refused by name. A warning
about the settings names the user's line, however deep the library builds the config."""

import sys
import warnings

import pytest

from trl_entropy import (
    ADAPOConfig,
    CEGPPOConfig,
    EntrocraftConfig,
    EntropyGRPOConfig,
    ERCConfig,
    QAEConfig,
    QAETrainer,
)
from trl_entropy.core.config import EntropyGRPOBaseConfig
from trl_entropy.methods import combination
from trl_entropy.scripts import train_arguments


def parse(arguments, tmp_path):
    return train_arguments.parse_arguments([*arguments, "--output_dir", str(tmp_path), "--use_cpu"])


@pytest.mark.parametrize(
    "arguments",
    [
        ["--method", "qae+kl_cov"],
        ["--method", "kl_cov+qae"],  # any order
        ["--config", "{dir}/combined.yaml"],
        ["--config", "{dir}/both.yaml"],
    ],
)
def test_a_combination_from_the_command_line_or_yaml(arguments, tmp_path):
    (tmp_path / "combined.yaml").write_text("entropy_control: [qae, kl_cov]\nqae_quantile_k: 0.3\n")
    (tmp_path / "both.yaml").write_text("method: qae+kl_cov\nentropy_control: [kl_cov, qae]\nqae_quantile_k: 0.3\n")
    arguments = [argument.format(dir=tmp_path) for argument in arguments]
    _, script_args, training_args, _ = parse([*arguments, "--kl_cov_ratio", "0.01"], tmp_path)
    assert type(training_args) is combination(["qae", "kl_cov"]).config_class
    assert script_args.method == "qae+kl_cov" or sorted(script_args.method.split("+")) == ["kl_cov", "qae"]
    assert sorted(training_args.entropy_control) == ["kl_cov", "qae"]
    assert training_args.kl_cov_ratio == 0.01
    assert training_args.qae_quantile_k == (0.3 if "--config" in arguments else 0.4)


def test_help_lists_both_methods_options(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        parse(["--method", "repo_d+clip_cov", "--help"], tmp_path)
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for option in ("--repo_beta", "--repo_variant", "--clip_cov_ratio", "--cov_selection_scope"):
        assert option in text
    assert "repo_d+clip_cov:" in text
    assert "(default: D)" in text  # the variant's default


BAD = [
    (["--method", "qae+"], "argument --method 'qae+': entropy_control names '', but it is no method"),
    (["--method", "+qae"], "entropy_control names '', but it is no method"),
    (["--method", "qae+qae"], "names ['qae'] more than once"),
    (["--method", "qae+nope"], "entropy_control names 'nope', but it is no method"),
    (["--method", "grpo+qae"], "entropy_control names 'grpo', but it is no entropy control"),
    (["--method", "aent+entropic"], "both act on the entropy regulariser"),
    (["--method", "clip_cov+kl_cov"], "cannot act together"),
    (["--method", "qae", "--kl_cov_ratio", "0.1"], "--kl_cov_ratio is an option of kl_cov, which --method qae"),
    (
        ["--method", "qae+kl_cov", "--entropy_control", "qae"],
        "--entropy_control ['qae'] does not match --method qae+kl_cov",
    ),
    (["--config", "{dir}/mismatch.yaml"], "sets method 'qae+kl_cov' and entropy_control ['qae']"),
    (["--config", "{dir}/not_a_list.yaml"], "entropy_control in {dir}/not_a_list.yaml must be a list"),
    (["--method", "qae+ce_gppo", "--loss_type", "sapo"], "ce_gppo does not support loss_type='sapo'"),
]


@pytest.mark.parametrize(("arguments", "message"), BAD)
def test_a_malformed_combination_is_a_usage_error_that_says_what_to_change(arguments, message, capsys, tmp_path):
    (tmp_path / "mismatch.yaml").write_text("method: qae+kl_cov\nentropy_control: [qae]\n")
    (tmp_path / "not_a_list.yaml").write_text("entropy_control: qae\n")
    with pytest.raises(SystemExit) as exit_:
        parse([argument.format(dir=tmp_path) for argument in arguments], tmp_path)
    assert exit_.value.code == 2
    assert message.format(dir=tmp_path) in capsys.readouterr().err


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (dict(entropy_control=["qae"], kl_cov_ratio=0.1), ValueError, "kl_cov_ratio is an option of 'kl_cov'"),
        (dict(kl_cov_ratio=0.1), ValueError, "kl_cov_ratio is an option of 'kl_cov', which entropy_control=None"),
        (dict(cov_selection_scope="micro_batch"), ValueError, "an option of 'clip_cov' or 'kl_cov'"),
        (dict(entropy_control=["qae", "qae"]), ValueError, "more than once"),
        (dict(entropy_control="qae"), ValueError, "must be a list of the names --method lists"),
        (dict(entropy_control=[]), ValueError, "selects no method"),
        (dict(entropy_control=["kl_cov", "ce_gppo"]), ValueError, "both act on the surrogate"),
    ],
)
def test_bad_python_settings_are_refused_by_name(options, error, message, tmp_path):
    with pytest.raises(error, match=message):
        EntropyGRPOConfig(output_dir=str(tmp_path), use_cpu=True, **options)


def test_one_method_by_name_trains_as_its_own_config_and_a_methods_config_takes_only_itself(tmp_path):
    """No class is swapped: EntropyGRPOConfig naming one method is an EntropyGRPOConfig, with that method's part, its
    defaults and its checks, and its own trainer takes it."""
    config = EntropyGRPOConfig(output_dir=str(tmp_path), use_cpu=True, entropy_control=["qae"])
    own = QAEConfig(output_dir=str(tmp_path), use_cpu=True)
    assert type(config) is EntropyGRPOConfig and config.method_parts == QAEConfig.method_parts
    settings = config.to_dict()
    assert {name: settings[name] for name in own.to_dict()} == own.to_dict() | {"entropy_control": ["qae"]}
    assert config.method_label == own.method_label == "QAETrainer"  # a checkpoint of either resumes with the other
    assert QAETrainer.config_class.coerce(config, "QAETrainer") is config
    with pytest.raises(ValueError, match="multi_objective_aggregation"):  # QAE's own check
        EntropyGRPOConfig(
            output_dir=str(tmp_path),
            use_cpu=True,
            entropy_control=["qae"],
            multi_objective_aggregation="normalize_then_sum",
        )
    assert type(QAEConfig(output_dir=str(tmp_path), use_cpu=True, entropy_control=["qae"])) is QAEConfig
    with pytest.raises(ValueError, match="does not match QAEConfig, the config of other methods"):
        QAEConfig(output_dir=str(tmp_path), use_cpu=True, entropy_control=["qae", "kl_cov"])


def test_a_combined_config_pickles_and_copies_as_itself(tmp_path):
    import copy
    import pickle

    config = EntropyGRPOConfig(output_dir=str(tmp_path), use_cpu=True, entropy_control=["kl_cov", "qae"])
    assert type(pickle.loads(pickle.dumps(config))) is type(config)  # training_args.bin in every checkpoint
    assert copy.deepcopy(config).to_dict() == config.to_dict()


def test_the_demo_runs_every_combination_that_has_a_config_and_refuses_a_bad_one(tmp_path):
    from pathlib import Path

    from trl_entropy.demo.arguments import DemoArguments, run_settings
    from trl_entropy.methods import METHODS

    demo = DemoArguments()
    shipped = sorted(path.stem for path in Path(demo.configs_dir).glob("*+*.yaml"))
    assert {"qae+kl_cov", "qae+clip_cov", "aent+adapo"} <= set(shipped)
    assert demo.methods == [*METHODS, *shipped]
    for name in shipped:
        method, settings = run_settings(name, demo)
        assert combination(method.split("+")) is combination(name.split("+")) and settings
    no_configs = DemoArguments(configs_dir=str(tmp_path))
    assert no_configs.methods == list(METHODS)
    assert run_settings("erc+qae", no_configs) == ("erc+qae", {})  # the library defaults
    with pytest.raises(ValueError, match="both act on the entropy regulariser"):
        run_settings("aent+entropic", no_configs)


@pytest.mark.parametrize(
    ("names", "field", "expected"),
    [
        (["adapo"], "epsilon_high", 0.28),  # ADAPOConfig's own default for a field of the base
        (["aent", "adapo"], "epsilon_high", 0.28),
        (["repo_d"], "repo_variant", "D"),  # the registry name's default
        (["entreg", "qae"], "entropy_coef", 1e-3),
    ],
)
def test_a_field_left_at_its_default_takes_the_default_a_selected_method_gives_it(names, field, expected, tmp_path):
    config = EntropyGRPOConfig(output_dir=str(tmp_path), use_cpu=True, entropy_control=names)
    assert getattr(config, field) == expected
    assert getattr(EntropyGRPOConfig(output_dir=str(tmp_path), use_cpu=True), field) != expected  # not the base's
    given = {"epsilon_high": 0.3, "repo_variant": "R", "entropy_coef": 2e-3}[field]
    options = dict(output_dir=str(tmp_path), use_cpu=True, entropy_control=names, **{field: given})
    if field == "repo_variant":  # a name that stands for a choice refuses another, naming the name that stands for it
        with pytest.raises(
            ValueError, match="names 'repo_d', which stands for repo_variant='D'.*name 'repo_r' instead"
        ):
            EntropyGRPOConfig(**options)
        return
    assert getattr(EntropyGRPOConfig(**options), field) == given  # a value set is kept


# A warning about the user's settings (core/warn.py) is shown at the user's line that builds the config, so that
# Python's display and filters by module (-W error::UserWarning:MODULE) name the user's code: a method's own config,
# EntropyGRPOConfig (which composes the methods' configs) and TRL's argument parser reach the check at other depths.
# (a method's own config, the entropy_control that selects the method; the settings that warn; the warning's start)
WARNED_SETTINGS = [
    (EntropyGRPOBaseConfig, None, {"epsilon_high": 0.28}, "epsilon=0.2, epsilon_high=0.28 with fully on-policy"),
    (ADAPOConfig, ["adapo"], {}, "ADAPO with fully on-policy updates"),
    (ERCConfig, ["erc"], {}, "ERC with fully on-policy updates"),
    (CEGPPOConfig, ["ce_gppo"], {}, "CE-GPPO with fully on-policy updates"),
    (EntrocraftConfig, ["entrocraft"], {"use_adaptive_entropy": True}, "Entrocraft holds the entropy in its band"),
]


def warned_at(caught, start: str) -> tuple[str, int]:
    """The file and line of the one warning of ``caught`` whose message starts with ``start``."""
    (warned,) = [item for item in caught if str(item.message).startswith(start)]
    return warned.filename, warned.lineno


@pytest.mark.parametrize("combined", [False, True], ids=["own", "combined"])
@pytest.mark.parametrize(
    ("config_class", "names", "options", "start"), WARNED_SETTINGS, ids=[row[0].__name__ for row in WARNED_SETTINGS]
)
def test_a_warning_about_the_settings_names_the_line_that_builds_the_config(
    config_class, names, options, start, combined, tmp_path
):
    if combined:
        config_class, options = EntropyGRPOConfig, {"entropy_control": names, **options}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        config_class(output_dir=str(tmp_path), report_to=[], use_cpu=True, bf16=False, **options)
    assert warned_at(caught, start) == (__file__, line)


def test_a_warning_about_the_command_lines_settings_names_the_line_that_parses_it(tmp_path):
    arguments = ["--method", "aent+adapo", "--num_iterations", "1", "--output_dir", str(tmp_path), "--use_cpu"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        train_arguments.parse_arguments(arguments)
    assert warned_at(caught, "ADAPO with fully on-policy updates") == (__file__, line)
