"""How ``EntropyGRPOConfig`` trains the methods its ``entropy_control`` names, and how its file is written.

``EntropyGRPOConfig`` (``methods/combined.py``) is a plain dataclass: every registered method's config is one of its
bases, so it has every method's fields with their helps, defaults and checks, and :class:`MethodsSelection`, its first
base, makes it train only the selected methods: their parts, in axis order, their checks and loss-type refusals, and
the defaults they give fields left at their defaults. A field of a method it does not select is refused when set (a
value other than its default). Its file is written from the registry by ``python docs/tables.py --write``
(:func:`combined_source`), with the docs' tables; ``--check``, which the tests run, says when it is stale.
docs/composing.md.
"""

import math
from dataclasses import fields

from ..core.config import FIELD_RULES, EntropyGRPOBaseConfig, Range
from ..core.trl.objectives import LOSS_TYPES
from .compose import SEPARATOR, default_of, in_axis_order, method_defaults, refuse_contradicted_name
from .registry import FIELD_OWNERS, METHODS, SPECS


class MethodsSelection(EntropyGRPOBaseConfig):
    """What makes a config with every method's fields train the methods ``entropy_control`` names."""

    def selected(self) -> tuple[str, ...]:
        """The names ``entropy_control`` gives, checked, in axis order (empty: none)."""
        return () if self.entropy_control is None else in_axis_order(self.entropy_control, METHODS)

    def select_methods(self) -> None:
        names = self.selected()
        chosen = [METHODS[name] for name in names]
        declared_again = set(FIELD_OWNERS) | set(BASE_FIELDS_METHODS_SET)
        options_set = {name for name in declared_again if getattr(self, name) is not None}
        base = [item for item in fields(EntropyGRPOBaseConfig) if item.name not in declared_again]
        options_set |= {item.name for item in base if getattr(self, item.name) != default_of(item)}
        for option, methods in FIELD_OWNERS.items():
            if option in options_set and not any(option in e.config_class.__dataclass_fields__ for e in chosen):
                raise ValueError(
                    f"{option} is an option of {' or '.join(repr(name) for name in methods)}, which "
                    f"entropy_control={self.entropy_control!r} does not select: add the method to entropy_control, or "
                    "leave the option out."
                )
        for name, entry in zip(names, chosen, strict=True):  # a name that stands for a choice holds to it
            for key, value in entry.defaults.items():
                chooses = "choices" in self.__dataclass_fields__[key].metadata
                if chooses and key in options_set and getattr(self, key) != value:
                    refuse_contradicted_name(name, key, getattr(self, key), METHODS)
        for key, value in method_defaults(names, chosen).items():
            if key not in options_set:
                setattr(self, key, value)
        for entry in chosen:  # every other field of a selected method left at None: the method's default
            for item in fields(entry.config_class):
                if item.name in FIELD_OWNERS and getattr(self, item.name) is None:
                    setattr(self, item.name, default_of(item))
        for name in BASE_FIELDS_METHODS_SET:  # a field of the base no selected method gives: the base's default
            if getattr(self, name) is None:
                setattr(self, name, default_of(EntropyGRPOBaseConfig.__dataclass_fields__[name]))

    def method_configs(self) -> list[tuple[str, type]]:
        selected = [(name, METHODS[name].config_class) for name in self.selected()]
        return selected or [("EntropyGRPO", EntropyGRPOBaseConfig)]

    def configs(self) -> list[type]:
        return [METHODS[name].config_class for name in self.selected()]

    def reads_max_steps(self) -> bool:
        return any(config_class.reads_max_steps(self) for _, config_class in self.method_configs())

    @property
    def method_parts(self) -> tuple[type, ...]:
        return tuple(part for config_class in self.configs() for part in config_class.method_parts)

    @property
    def model_card(self) -> list | None:
        chosen = [METHODS[name] for name in self.selected()]
        return [(entry.name, entry.paper, entry.tag) for entry in chosen if entry.paper is not None] or None

    @property
    def method_label(self) -> str:
        names = self.selected()
        if not names:
            return "EntropyGRPOTrainer"
        if len(names) == 1 and not METHODS[names[0]].defaults:
            return METHODS[names[0]].trainer_class.__name__
        return f"Trainer[{SEPARATOR.join(names)}]"

    @property
    def supported_loss_types(self) -> tuple[str, ...]:
        configs = self.configs()
        return tuple(t for t in LOSS_TYPES if all(t in c.supported_loss_types for c in configs))

    @property
    def controls_clip_range(self) -> bool:
        return any(c.controls_clip_range for c in self.configs())

    @property
    def selects_trl_entropy_bonus(self) -> bool:
        """TRL's entropy bonus, selected by name, is the base's own config with its coefficient set."""
        return any(c is EntropyGRPOBaseConfig for c in self.configs())


# The fields the combined config declares again, each with the default None, "not set": a field of the base that a
# method gives another default (ADAPO's epsilon_high, entreg's entropy_coef) takes the selected method's or else the
# base's; a method's own field takes the selected method's default, and a value set for a method that is not selected
# is refused.
def base_fields_methods_set() -> tuple[str, ...]:
    base = EntropyGRPOBaseConfig.__dataclass_fields__
    changed = {
        item.name
        for spec in SPECS
        for item in fields(spec.config_class)
        if item.name in base and item is not base[item.name]
    }
    changed |= {key for entry in METHODS.values() for key in entry.defaults if key in base}
    return tuple(sorted(changed))


BASE_FIELDS_METHODS_SET = base_fields_methods_set()


def method_field(name: str):
    """The field ``name`` as its method's config declares it (the first registered method that has it)."""
    return METHODS[FIELD_OWNERS[name][0]].config_class.__dataclass_fields__[name]


def combined_source() -> str:
    """The text of ``methods/combined.py``, from the registry, as ruff formats it."""
    configs = [spec.config_class for spec in SPECS if spec.config_class is not EntropyGRPOBaseConfig]
    imports = sorted(
        [(c.__module__.rsplit(".", 1)[1], c.__name__) for c in configs] + [("selection", "MethodsSelection")]
    )
    lines = [
        '"""`EntropyGRPOConfig`: every registered method\'s config as a base, training the methods that its',
        "`entropy_control` names (`methods/selection.py`). Written by `python docs/tables.py --write` from the",
        'registry: do not edit by hand."""',
        "",
        "from dataclasses import dataclass, field",
        "",
        "from ..core.config import Range, config_field",
        *(f"from .{module} import {name}" for module, name in imports),
        "",
        "",
        "@dataclass",
        "class EntropyGRPOConfig(",
        "    MethodsSelection,",
        *(f"    {c.__name__}," for c in reversed(configs)),  # the registry's first method's fields first
        "):",
        '    """Configuration for [`EntropyGRPOTrainer`]: every field of [`EntropyGRPOBaseConfig`] and of every',
        "    method's config, training the methods `entropy_control` names (docs/composing.md). A method's field left",
        '    at None takes the selected method\'s default."""',
    ]
    base = EntropyGRPOBaseConfig.__dataclass_fields__
    for name in BASE_FIELDS_METHODS_SET:
        item = base[name]
        help_text = item.metadata["help"]
        if item.default is not None:
            help_text += f" None: the selected method's default, else {item.default!r}."
        lines += [
            "",
            f"    {name}: {optional_type_source(item.type)} = field(",
            "        default=None,",
            "        metadata={",
            *string_lines(help_text, '            "help": ', "", 12),
            "        },",
            "    )",
        ]
    chosen = {key for entry in METHODS.values() for key in entry.defaults}  # the fields a registry name sets
    for name in FIELD_OWNERS:
        item = method_field(name)
        rule = FIELD_RULES.get(item)
        default = default_of(item)
        said = "the one the method's name stands for" if name in chosen else repr(default)
        help_text = f"{item.metadata['help']} None: the selected method's default ({said})."
        lines += ["", f"    {name}: {optional_type_source(item.type)} = config_field("]
        lines += ["        None,", *string_lines(help_text, "        ", ",", 8)]
        if rule is not None:
            if rule.valid is not None:
                lines.append(f"        valid={range_source(rule.valid)},")
            if rule.choices is not None:
                choices = ", ".join(quoted(choice) for choice in rule.choices)
                lines.append(f"        choices=({choices}{',' if len(rule.choices) == 1 else ''}),")
            none_means = rule.none_means if rule.none_means is not None else f"(the selected method's default, {said})"
            lines += string_lines(none_means, "        none_means=", ",", 8)
            if rule.note:
                lines += string_lines(rule.note, "        note=", ",", 8)
            if rule.flag:
                lines.append("        flag=True,")
        lines.append("    )")
    text = "\n".join(lines) + "\n"
    if "math.inf" in text:
        text = text.replace("from dataclasses import", "import math\nfrom dataclasses import", 1)
    return text


def range_source(valid: Range) -> str:
    """``valid`` as the call that makes it, naming only what differs from ``Range()``'s defaults."""
    parts = []
    for item in fields(Range):
        value = getattr(valid, item.name)
        if value != item.default:
            if isinstance(value, float):
                shown = number_source(value)
            else:
                shown = quoted(value) if isinstance(value, str) else repr(value)
            parts.append(f"{item.name}={shown}")
    return f"Range({', '.join(parts)})"


def number_source(value: float) -> str:
    return "math.inf" if value == math.inf else "-math.inf" if value == -math.inf else repr(value)


def optional_type_source(annotation) -> str:
    text = type_source(annotation)
    return text if text.endswith("| None") else f"{text} | None"


def quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def string_lines(text: str, opening: str, closing: str, indent: int, width: int = 119) -> list[str]:
    """``text`` as string literals of at most ``width`` characters a line, between ``opening`` and ``closing``: one
    line where it fits, else one literal a line, cut between words, in parentheses."""
    one = f"{opening}{quoted(text)}{closing}"
    if len(one) <= width:
        return [one]
    pad = " " * (indent + 4)
    pieces, current = [], ""
    for word in text.split(" "):
        trial = f"{current} {word}" if current else word
        if current and len(pad) + len(quoted(trial + " ")) > width:
            pieces.append(current + " ")
            current = word
        else:
            current = trial
    pieces.append(current)
    return [f"{opening}(", *(pad + quoted(piece) for piece in pieces), " " * indent + ")" + closing]


def type_source(annotation) -> str:
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
