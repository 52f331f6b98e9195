"""The command line of ``trl-entropy train`` (and examples/train.py): TRL's parser for the chosen method's config,
TRL's ``ModelConfig`` and :class:`TrainScriptArguments`, with the method's options first in ``--help``, the toy recipe
as the defaults when no model is named, the precision fallback on machines without bf16, and one output folder per
kind of run. :func:`parse_arguments` turns a command line into the three argument objects, or exits as argparse does.
"""

import argparse
import os
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml
from trl import GRPOConfig, ModelConfig, ScriptArguments, TrlParser

from trl_entropy.core.config import EntropyGRPOBaseConfig
from trl_entropy.methods import FIELD_OWNERS, METHODS, get_method
from trl_entropy.methods.compose import SEPARATOR
from trl_entropy.toy import CHAT_ARITHMETIC_MAX_DIGITS, TOY_NUM_PROMPTS, TOY_TRAINING_DEFAULTS


USAGE = "%(prog)s [--method NAME] [--config FILE.yaml] [--OPTION VALUE ...]"
# TRL fields that are the whole of a method implemented by TRL itself: listed with the method's own options.
TRL_OPTIONS_OF_METHOD = {
    "entreg": [
        "entropy_coef",
        "use_adaptive_entropy",
        "entropy_target",
        "entropy_coef_delta",
        "entropy_coef_min",
        "entropy_coef_max",
    ]
}


@dataclass
class TrainScriptArguments(ScriptArguments):
    """Script arguments: TRL's dataset options plus the method, the chat arithmetic task and the toy task's size."""

    method: str = field(
        default="grpo",
        metadata={
            "help": "The method to train with: "
            + "; ".join(f"{name} = {method.description}" for name, method in METHODS.items())
            + f". Methods on different axes of the loss step combine with '{SEPARATOR}' (NAME{SEPARATOR}NAME, "
            "docs/composing.md). `--method NAME --help` lists that method's options.",
        },
    )
    dataset_image_column: str | None = field(
        default=None,
        metadata={
            "help": "Train a vision-language model on image questions: the dataset column holding each question's "
            "image. It becomes the 'image' column trl.GRPOTrainer reads (TRL's own scripts take a column named "
            "'image' as it is); the model's processor (AutoProcessor) replaces the tokenizer, and the image "
            "placeholder tokens are kept out of the sampled completions."
        },
    )
    chat_arithmetic_digits: int | None = field(
        default=None,
        metadata={
            "help": "Train --model_name_or_path (an instruct model with a chat template) on the chat arithmetic task "
            "instead of --dataset_name: 'What is a + b? Answer with a single number.' with operands of this many "
            f"digits (1 to {CHAT_ARITHMETIC_MAX_DIGITS}), from the task's training split, scored by the answer the "
            "reply states, its first number or \\boxed{} answer (trl_entropy.rewards.stated_answer_reward)."
        },
    )
    toy_num_prompts: int = field(
        default=TOY_NUM_PROMPTS,
        metadata={
            "help": "Distinct toy problems to train on (at most 320), repeated as often as training needs; used when "
            "there is no --model_name_or_path. A small pool is what lets GRPO sharpen the toy policy within a few "
            "hundred steps."
        },
    )
    toy_policy_cache: str | None = field(
        default="auto",
        metadata={
            "help": "Folder caching the warm-started toy policy between runs. 'auto': outputs/toy_policy, shared by "
            "the runs that save under outputs/, or <output_dir>/toy_policy when --output_dir is given (nothing is "
            "written outside the folder you name); None rebuilds it each time."
        },
    )

    def __post_init__(self):
        digits = self.chat_arithmetic_digits
        if digits is not None and not 1 <= digits <= CHAT_ARITHMETIC_MAX_DIGITS:
            raise ValueError(
                f"chat_arithmetic_digits must be from 1 to {CHAT_ARITHMETIC_MAX_DIGITS} (digits of each operand), "
                f"got {digits}"
            )


def usage_error(message: str, prog: str | None):
    """Exit as argparse does on a bad command line: the usage line, the message, status 2, no traceback."""
    argparse.ArgumentParser(prog=prog, usage=USAGE, add_help=False).error(message)


def bf16_accelerator_available() -> bool:
    """Whether transformers accepts bf16 without --use_cpu on this machine (its own test)."""
    from transformers.utils import is_torch_bf16_gpu_available, is_torch_xla_available

    return is_torch_bf16_gpu_available() or is_torch_xla_available()


def method_option_names(method_name: str) -> list[str]:
    """The options that make the methods what they are: each one's config fields that the base lacks or sets
    otherwise, the registry's defaults for it, and the TRL fields of a method TRL implements itself."""
    if SEPARATOR in method_name:
        names = [name for part in method_name.split(SEPARATOR) for name in method_option_names(part)]
        return [name for name in dict.fromkeys(names) if name != "entropy_control"]
    method = get_method(method_name)
    base = {item.name: item for item in fields(EntropyGRPOBaseConfig)}
    names = [
        item.name
        for item in fields(method.config_class)
        if item.name not in base
        or (item.default, item.default_factory) != (base[item.name].default, base[item.name].default_factory)
    ]
    for name in [*method.defaults, *TRL_OPTIONS_OF_METHOD.get(method_name, [])]:
        if name not in names:
            names.append(name)
    return names


class TrainParser(TrlParser):
    """TRL's parser for one method, with this script's help layout, precision fallback and default output folder."""

    def __init__(self, method_name: str, config_file: str | None = None, prog: str | None = None):
        self.method_name = method_name
        self.config_file = config_file
        self.notices: list[str] = []  # printed once the run is known to start
        method = get_method(method_name)
        super().__init__(
            (TrainScriptArguments, method.config_class, ModelConfig),
            prog=prog,
            usage=USAGE,
            allow_abbrev=False,  # `--meth x` would parse, but the parser is built for the method named in full
            description="Train a policy with GRPO or an entropy-control method (trl_entropy). Without "
            "--model_name_or_path it trains the built-in toy policy on the toy task, on the CPU.",
            epilog="Examples: docs/getting_started.md. Each method's page in docs/ explains its options.",
        )
        # TrlParser reads --config itself before parsing; it is declared here only so that --help shows it.
        self.add_argument(
            "--config",
            metavar="FILE.yaml",
            default=argparse.SUPPRESS,
            help="YAML file of option values (any flag below, without the dashes; `method:` included). The command "
            "line wins over the file. examples/configs/ (a link to the package's trl_entropy/demo/configs/) has one "
            "per method.",
        )
        # The config of several methods has every method's fields: those of the methods not chosen are not options.
        own = set(method_option_names(method_name))
        self.foreign_options = {name for name in FIELD_OWNERS if name not in own}
        for action in self._actions:
            if action.dest in self.foreign_options:
                action.help = argparse.SUPPRESS
        optional_bools = {
            item.name for dtype in self.dataclass_types for item in fields(dtype) if item.type == bool | None
        }
        for action in self._actions:
            if action.dest in optional_bools and action.option_strings[0] == f"--{action.dest}":
                # TRL's `bf16: bool | None` would otherwise need a value: `--bf16` alone means true, like every flag.
                action.nargs, action.const = "?", True
            if action.dest == "output_dir":
                action.help = (
                    "Where the model (or LoRA adapter) and checkpoints go. Default: a folder per kind of run, "
                    "outputs/<method>[-<config file>]-<model>[-lora]."
                )

    def help_sections(self) -> list[tuple[str, str | None, list]]:
        """(title, text, actions) in the order --help shows them: the choice of method first, TRL's options last."""
        method = get_method(self.method_name)
        own = method_option_names(self.method_name)
        grpo = {item.name for item in fields(GRPOConfig)}
        kernel = [
            item.name for item in fields(EntropyGRPOBaseConfig) if item.name not in grpo and item.name not in own
        ]
        script = [item.name for item in fields(TrainScriptArguments) if item.name != "method"]
        model = [item.name for item in fields(ModelConfig)]
        groups = {
            "choice": ["help", "method", "config"],
            "own": own,
            "kernel": kernel,
            "script": script,
            "model": model,
        }
        placed = {name for names in groups.values() for name in names}
        by_dest = {name: [action for action in self._actions if action.dest == name] for name in placed}
        rest = [action for action in self._actions if action.dest not in placed]
        own_text = None if own else "No options of its own: its settings are TRL's, listed last."
        return [
            ("choose the method", None, [a for name in groups["choice"] for a in by_dest[name]]),
            (
                f"{self.method_name}: {method.description} ({method.config_class.__name__})",
                own_text,
                [a for name in own for a in by_dest[name]],
            ),
            ("entropy kernel (every method)", None, [a for name in kernel for a in by_dest[name]]),
            ("data and the toy task", None, [a for name in script for a in by_dest[name]]),
            ("model, LoRA and quantization (TRL's ModelConfig)", None, [a for name in model for a in by_dest[name]]),
            ("training (TRL's GRPOConfig and transformers' TrainingArguments)", None, rest),
        ]

    def format_help(self) -> str:
        formatter = self._get_formatter()
        formatter.add_usage(self.usage, self._actions, self._mutually_exclusive_groups)
        formatter.add_text(self.description)
        for title, text, actions in self.help_sections():
            formatter.start_section(title)
            formatter.add_text(text)
            formatter.add_arguments(actions)
            formatter.end_section()
        formatter.add_text(self.epilog)
        return formatter.format_help()

    def parse_known_args(self, args=None, namespace=None):
        for argument in sys.argv[1:] if args is None else args:
            self.refuse_option_of_another_method(argument, self.foreign_options)
        namespace, unknown = super().parse_known_args(args, namespace)
        for argument in unknown:
            self.refuse_option_of_another_method(argument, FIELD_OWNERS)
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        self.resolve_precision(namespace)
        if namespace.toy_policy_cache == "auto":
            folder = "outputs" if namespace.output_dir is None else namespace.output_dir
            namespace.toy_policy_cache = os.path.join(folder, "toy_policy")
        if namespace.output_dir is None:
            namespace.output_dir = default_output_dir(
                self.method_name, self.config_file, namespace.model_name_or_path, namespace.use_peft
            )
        return namespace, unknown

    def refuse_option_of_another_method(self, argument: str, options) -> None:
        """Exit with a usage error when ``argument`` is ``--OPTION`` of a method this command does not choose."""
        option = argument.removeprefix("--").split("=", 1)[0].replace("-", "_")
        if argument.startswith("--") and option in options:
            owners = FIELD_OWNERS[option]
            self.error(
                f"{argument.split('=', 1)[0]} is an option of {' or '.join(owners)}, which --method "
                f"{self.method_name} does not select: add the method ({self.method_name}{SEPARATOR}{owners[0]}) "
                "or leave it out"
            )

    def resolve_precision(self, namespace) -> None:
        """TRL's default bf16 is refused by transformers without a GPU that has it: fall back to fp32 there."""
        accelerator = bf16_accelerator_available()
        if namespace.bf16 is None and not namespace.fp16 and (namespace.use_cpu or not accelerator):
            namespace.bf16 = False
            reason = "--use_cpu" if namespace.use_cpu else "no GPU with bf16 support here"
            self.notices.append(f"{self.prog}: {reason}: training in fp32 (TRL's default, bf16, is for GPUs)")
        elif namespace.bf16 and not namespace.use_cpu and not accelerator:
            self.error(
                "--bf16 needs a GPU with bf16 support and this machine has none: leave --bf16 out to train in fp32, "
                "or add --use_cpu to train in bf16 on the CPU"
            )


def default_output_dir(method_name: str, config_file: str | None, model: str | None, use_peft: bool) -> str:
    """outputs/<method>[-<config file>]-<model>[-lora]: the same for every process of a run, different for runs that
    save different things (a full model and a LoRA adapter never share a folder)."""
    parts = [method_name]
    if config_file is not None and Path(config_file).stem != method_name:
        parts.append(Path(config_file).stem)
    parts.append("toy" if model is None else Path(model.rstrip("/")).name)
    if use_peft:
        parts.append("lora")
    return str(Path("outputs") / "-".join(parts))


def option_value(argv: list[str], name: str) -> str | None:
    """The value of ``--name`` on the command line (``--name value`` or ``--name=value``), else None."""
    for index, argument in enumerate(argv):
        if argument == f"--{name}" and index + 1 < len(argv):
            return argv[index + 1]
        if argument.startswith(f"--{name}="):
            return argument.split("=", 1)[1]
    return None


def read_config_file(path: str, prog: str | None) -> dict:
    try:
        text = Path(path).read_text()
    except OSError:
        usage_error(f"argument --config: no config file at {path}", prog)
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError as error:
        usage_error(f"argument --config: {path} is not valid YAML: {error}", prog)
    if values is not None and not isinstance(values, dict):
        usage_error(f"argument --config: {path} must hold option names and values (a YAML mapping)", prog)
    return values or {}


def method_of_config_file(from_yaml: dict, config_file: str | None, prog: str | None) -> str:
    """The method a YAML config names: its ``method:``, or its ``entropy_control:`` list joined by ``+`` (both: they
    must agree); ``grpo`` when it names none."""
    method, control = from_yaml.get("method"), from_yaml.get("entropy_control")
    if control is None:
        return "grpo" if method is None else method
    if not isinstance(control, list) or not all(isinstance(name, str) for name in control):
        usage_error(f"argument --config: entropy_control in {config_file} must be a list of method names", prog)
    joined = SEPARATOR.join(control)
    if method is not None and set(str(method).split(SEPARATOR)) != set(control):
        usage_error(f"argument --config: {config_file} sets method {method!r} and entropy_control {control!r}", prog)
    return joined


def build_parser(argv: list[str], prog: str | None = None) -> TrainParser:
    """A parser for the method named on the command line or in the YAML config, with that method's defaults;
    ``prog`` names the program in its messages (default: the script's file name, as argparse's)."""
    config_file = option_value(argv, "config")
    from_yaml = read_config_file(config_file, prog) if config_file is not None else {}
    method_name = option_value(argv, "method")
    source = "" if method_name is not None else f" (in {config_file})"
    if method_name is None:
        method_name = method_of_config_file(from_yaml, config_file, prog)
    if not isinstance(method_name, str) or (SEPARATOR not in method_name and method_name not in METHODS):
        usage_error(
            f"argument --method: unknown method {method_name!r}{source}; choose one of {', '.join(METHODS)}, or "
            f"several joined by '{SEPARATOR}'",
            prog,
        )
    try:
        get_method(method_name)
    except ValueError as error:
        usage_error(f"argument --method {method_name!r}{source}: {error}", prog)
    parser = TrainParser(method_name, config_file, prog)
    # TRL's own message for this one names a parser argument; say which keys the chosen method lacks instead.
    foreign = sorted(
        (set(from_yaml) - {action.dest for action in parser._actions} - {"env"})
        | (set(from_yaml) & parser.foreign_options)
    )
    if foreign:
        parser.error(f"argument --config: {config_file} sets {', '.join(foreign)}, which --method {method_name} lacks")
    defaults = {"method": method_name, **get_method(method_name).defaults}
    if option_value(argv, "model_name_or_path") is None and "model_name_or_path" not in from_yaml:
        defaults.update(TOY_TRAINING_DEFAULTS)
    parser.set_defaults(**defaults)
    return parser


def split_config_option(argument: str) -> list[str]:
    """``--config=FILE`` as ``--config FILE``, the only form TrlParser reads."""
    return argument.split("=", 1) if argument.startswith("--config=") else [argument]


def parse_arguments(argv: list[str], prog: str | None = None):
    """``(parser, script_args, training_args, model_args)``; a bad command line or config exits with a usage error."""
    argv = [part for argument in argv for part in split_config_option(argument)]
    parser = build_parser(argv, prog)
    try:
        script_args, training_args, model_args = parser.parse_args_and_config(args=argv)
    except ValueError as error:  # the configs' own checks, which name the field and the fix
        parser.error(str(error))
    named = getattr(training_args, "entropy_control", None)
    if SEPARATOR in script_args.method and set(named or ()) != set(script_args.method.split(SEPARATOR)):
        parser.error(
            f"--entropy_control {named!r} does not match --method {script_args.method}: leave --entropy_control out, "
            "or name the same methods"
        )
    if script_args.method == "entreg" and training_args.entropy_coef == 0 and not training_args.use_adaptive_entropy:
        parser.error("--method entreg needs --entropy_coef > 0 or --use_adaptive_entropy")
    return parser, script_args, training_args, model_args
