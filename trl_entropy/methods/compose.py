"""Methods combined: one config made from the methods that ``entropy_control`` names, whose parts the trainer runs.

Each method acts on one axis of the loss step (the first place its declaration's ``acts_on`` names). A combination
takes at most one method per axis, except the gates, which all act, one after another, and the axes act in the order
of ``AXES``: the group baseline's advantages feed the token advantages, which are the surrogate's ``A``; the gates act
on the surrogate's per-token loss. The combined config lists the methods' parts in that order (``method_parts``), and
``EntropyGRPOTrainer`` asks each for its seams; it has the methods' configs as its bases, so it takes every selected
method's fields with their defaults and their checks. One method whose registry name sets no defaults is its own
config. docs/composing.md.
"""

from dataclasses import dataclass, field, fields, make_dataclass, replace

from ..core.config import FIELD_RULES, EntropyGRPOConfig, refuse_loss_type
from ..core.trainer import EntropyGRPOTrainer
from ..core.trl.objectives import LOSS_TYPES
from .spec import MethodSpec, Neutral, Place


@dataclass(frozen=True)
class Axis:
    """One axis of the loss step: its place in the order, its name, and whether several methods may act on it."""

    order: int
    name: str
    several: bool = False


AXES: dict[Place, Axis] = {
    Place.GROUP_BASELINE: Axis(1, "group baseline"),
    Place.ADVANTAGES: Axis(2, "per-token advantage"),
    Place.SURROGATE: Axis(3, "surrogate"),
    Place.GATES: Axis(4, "stop-gradient gates", several=True),
    Place.CLIP_RANGE: Axis(5, "clip bound"),
    Place.REGULARISER: Axis(6, "entropy regulariser"),
}
# Joins the names of a combination: `--method NAME+NAME`, and the combined classes' names.
SEPARATOR = "+"


def axis_of(entry: MethodSpec) -> Axis:
    return AXES[entry.acts_on[0]]


def controls_entropy(entry: MethodSpec) -> bool:
    """False for the registry's name of plain GRPO: the base's own config and trainer, no setting of its own."""
    return entry.config_class is not EntropyGRPOConfig or bool(entry.defaults)


def in_axis_order(names, registry: dict[str, MethodSpec]) -> tuple[str, ...]:
    """``names`` checked and sorted by axis (then by registry order); a ValueError says what to change otherwise:
    not a list, empty, an unknown name, a name twice, two methods on one axis, or a pair that cannot act together."""
    if isinstance(names, str) or not isinstance(names, (list, tuple)):
        raise ValueError(
            f"entropy_control={names!r} is invalid: it must be a list of the names --method lists (on the command "
            f"line: --method NAME{SEPARATOR}NAME)."
        )
    if not names:
        raise ValueError(
            "entropy_control=[] selects no method: name at least one, or leave entropy_control=None for none."
        )
    choices = [name for name, entry in registry.items() if controls_entropy(entry)]
    for name in names:
        if name not in choices:
            reason = "it is no entropy control: leave it out" if name in registry else "it is no method"
            raise ValueError(f"entropy_control names {name!r}, but {reason}; choose among {choices}.")
    twice = sorted({name for name in names if list(names).count(name) > 1})
    if twice:
        raise ValueError(f"entropy_control names {twice} more than once; name each method once.")
    ordered = tuple(sorted(names, key=lambda name: (axis_of(registry[name]).order, choices.index(name))))
    for index, first in enumerate(ordered):
        for second in ordered[index + 1 :]:
            refuse_pair(first, second, registry)
    return ordered


def refuse_pair(first: str, second: str, registry: dict[str, MethodSpec]) -> None:
    """Two methods on one axis (the gates excepted), and a method that acts through the PPO clip next to one whose
    surrogate has none, are refused, naming both."""
    axis = axis_of(registry[first])
    if axis is axis_of(registry[second]) and not axis.several:
        raise ValueError(
            f"entropy_control selects {first!r} and {second!r}, which both act on the {axis.name} (axis {axis.order} "
            "of the loss step), where only one method acts: choose one of them (docs/composing.md)."
        )
    for needs, replaces in ((first, second), (second, first)):
        if registry[needs].needs_ppo_clip and registry[replaces].replaces_ppo_clip:
            raise ValueError(
                f"entropy_control selects {first!r} and {second!r}, which cannot act together: {needs!r} acts through "
                f"the PPO clip of the loss type, and {replaces!r} replaces that clip by its own surrogate, so there "
                "is no clip for it to act on. Choose one of them (docs/composing.md)."
            )


def combine(names: tuple[str, ...], registry: dict[str, MethodSpec], rebuild) -> MethodSpec:
    """The registry entry of ``names`` (in axis order, from :func:`in_axis_order`) acting together: its config class
    (``rebuild(names, state)`` unpickles one), what it logs, and its model card's methods and papers. Its trainer is
    ``EntropyGRPOTrainer``, which trains whatever parts its config names."""
    entries = [registry[name] for name in names]
    if len(entries) == 1 and not entries[0].defaults:
        return entries[0]
    label = SEPARATOR.join(names)
    config_class = combined_config_class(label, names, entries, rebuild)
    return replace(
        entries[0],
        key=label,
        config_class=config_class,
        trainer_class=EntropyGRPOTrainer,
        description="; ".join(entry.description for entry in entries),
        defaults={},
        variants={},
        acts_on=tuple(place for entry in entries for place in entry.acts_on),
        metrics=tuple(dict.fromkeys(metric for entry in entries for metric in entry.metrics)),
        neutral=Neutral(),  # each method's neutral settings are its own entry's
        needs_all_ranks_rewards=any(entry.needs_all_ranks_rewards for entry in entries),
        moves_per_micro_batch=any(entry.moves_per_micro_batch for entry in entries),
        needs_ppo_clip=any(entry.needs_ppo_clip for entry in entries),
        replaces_ppo_clip=any(entry.replaces_ppo_clip for entry in entries),
        name=" + ".join(entry.name or entry.key for entry in entries),
        paper=None,
        tag=None,
        exports=(),
        sweep=None,  # a combination sweeps its methods' grids (examples/toy_sweep.py)
    )


def last_axis_first(classes) -> tuple[type, ...]:
    """The classes from the last axis to the first, less any that another one extends (the base's own config, under a
    method's)."""
    classes = list(dict.fromkeys(reversed(list(classes))))
    return tuple(c for c in classes if not any(other is not c and issubclass(other, c) for other in classes))


def combined_config_class(label: str, names: tuple[str, ...], entries: list[MethodSpec], rebuild) -> type:
    """The methods' configs as the bases of one dataclass, with every method's parts in axis order, the loss types that
    every method supports and each refusal naming the method that refuses. It pickles as ``rebuild(names, state)``,
    so that loading it needs no class looked up by name. A field keeps the default its method gives it, where it
    differs from the base's (each base's fields include those it inherits, which would otherwise win by the order of
    the bases), and the registry names' defaults; the field's check stays."""
    bases = last_axis_first(entry.config_class for entry in entries)
    base_fields = {f.name: f for f in fields(EntropyGRPOConfig)}
    defaults: dict[str, tuple] = {}  # field -> (default, the method that sets it, its field)
    for name, entry in zip(names, entries, strict=True):
        own = {f.name: f for f in fields(entry.config_class)}
        changed = {key: own[key].default for key in base_fields if own[key] is not base_fields[key]}
        for key, value in {**changed, **entry.defaults}.items():
            if key in defaults and defaults[key][0] != value:
                raise ValueError(
                    f"{defaults[key][1]!r} and {name!r} set {key} to different defaults ({defaults[key][0]!r} and "
                    f"{value!r}): they cannot be combined."
                )
            defaults[key] = (value, name, own[key])
    redeclared = []
    for key, (value, _, declared) in defaults.items():
        default = field(default=value, metadata=declared.metadata)
        if declared in FIELD_RULES:
            FIELD_RULES[default] = FIELD_RULES[declared]
        redeclared.append((key, declared.type, default))
    # The command line and YAML build this class directly: its own entropy_control is the default.
    control = EntropyGRPOConfig.__dataclass_fields__["entropy_control"]
    redeclared.append(
        ("entropy_control", control.type, field(default_factory=lambda: list(names), metadata=control.metadata))
    )
    methods = [(name, entry.config_class) for name, entry in zip(names, entries, strict=True)]

    def check_method_settings(self) -> None:
        for name, config_class in methods:
            refuse_loss_type(self.loss_type, name, config_class)

    def __reduce__(self):
        return rebuild, (names, dict(self.__dict__))

    signed = [(entry.name, entry.paper, entry.tag) for entry in entries if entry.paper is not None]

    namespace = {
        "__doc__": f"The config of {label}: every field of " + ", ".join(base.__name__ for base in bases) + ".",
        "__module__": "trl_entropy.methods",
        "__qualname__": f"Config[{label}]",
        "supported_loss_types": tuple(t for t in LOSS_TYPES if all(t in c.supported_loss_types for _, c in methods)),
        "controls_clip_range": any(config_class.controls_clip_range for _, config_class in methods),
        # TRL's entropy bonus, selected by name, is the base's own config with its coefficient set.
        "selects_trl_entropy_bonus": any(entry.config_class is EntropyGRPOConfig for entry in entries),
        "check_method_settings": check_method_settings,
        "__reduce__": __reduce__,
        "method_parts": tuple(part for entry in entries for part in entry.config_class.method_parts),
        "model_card": signed or None,
    }
    return make_dataclass(f"Config[{label}]", redeclared, bases=bases, namespace=namespace)


def owners_of_fields(registry: dict[str, MethodSpec]) -> dict[str, list[str]]:
    """Each field that a method's config adds to the base's -> the names of the methods whose config has it."""
    base = set(EntropyGRPOConfig.__dataclass_fields__)
    owners: dict[str, list[str]] = {}
    for name, entry in registry.items():
        for declared in fields(entry.config_class):
            if declared.name not in base:
                owners.setdefault(declared.name, []).append(name)
    return owners


def refuse_fields_of_unselected_methods(options: dict, names, config_class: type, owners: dict[str, list]) -> None:
    """A config option that belongs to a method ``names`` does not select (a field ``config_class``, their config,
    lacks) is refused, naming its method; ``owners`` is :func:`owners_of_fields` of the registry."""
    for option in options:
        if option in owners and option not in config_class.__dataclass_fields__:
            methods = " or ".join(repr(name) for name in owners[option])
            raise ValueError(
                f"{option} is an option of {methods}, which entropy_control={names!r} does not select: add the method "
                "to entropy_control, or leave the option out."
            )
