"""Methods combined: one config made from the methods that ``entropy_control`` names, whose parts the trainer runs.

Each method acts on one axis of the step (the first place its declaration's ``acts_on`` names). A combination takes
at most one method per axis, except the gates, which all act, one after another; the axes act in the order of
``core.places.PLACES``, where each place also says how its answers combine. The combined config lists the methods'
parts in that order (``method_parts``), and ``EntropyGRPOTrainer`` asks each for its seams; it has the methods'
configs as its bases, so it takes every selected method's fields with their defaults and their checks. One method
whose registry name sets no defaults is its own config. docs/composing.md.
"""

from dataclasses import MISSING, Field, fields, replace

from ..core.config import EntropyGRPOBaseConfig
from ..core.places import AXIS_ORDER, PLACES, Place
from ..core.trainer import EntropyGRPOTrainer
from .spec import MethodSpec, Neutral


# Joins the names of a combination: `--method NAME+NAME`, and the combined classes' names.
SEPARATOR = "+"


def axis_of(entry: MethodSpec) -> Place:
    """The method's axis: the first place it acts on."""
    return entry.acts_on[0]


def controls_entropy(entry: MethodSpec) -> bool:
    """False for the registry's name of plain GRPO: the base's own config and trainer, no setting of its own."""
    return entry.config_class is not EntropyGRPOBaseConfig or bool(entry.defaults)


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
    ordered = tuple(sorted(names, key=lambda name: (AXIS_ORDER[axis_of(registry[name])], choices.index(name))))
    for index, first in enumerate(ordered):
        for second in ordered[index + 1 :]:
            refuse_pair(first, second, registry)
    return ordered


def refuse_pair(first: str, second: str, registry: dict[str, MethodSpec]) -> None:
    """Two methods on one axis (the gates excepted), and a method that acts through the PPO clip next to one whose
    surrogate has none, are refused, naming both."""
    axis = axis_of(registry[first])
    if axis is axis_of(registry[second]) and not PLACES[axis].several:
        raise ValueError(
            f"entropy_control selects {first!r} and {second!r}, which both act on the {PLACES[axis].title} (axis "
            f"{AXIS_ORDER[axis]} of the step), where only one method acts: choose one of them (docs/composing.md)."
        )
    for needs, replaces in ((first, second), (second, first)):
        if registry[needs].needs_ppo_clip and registry[replaces].replaces_ppo_clip:
            raise ValueError(
                f"entropy_control selects {first!r} and {second!r}, which cannot act together: {needs!r} acts through "
                f"the PPO clip of the loss type, and {replaces!r} replaces that clip by its own surrogate, so there "
                "is no clip for it to act on. Choose one of them (docs/composing.md)."
            )


def combine(names: tuple[str, ...], registry: dict[str, MethodSpec], config_class: type) -> MethodSpec:
    """The registry entry of ``names`` (in axis order, from :func:`in_axis_order`) acting together: what it logs and
    its model card's methods and papers. Its config is ``config_class`` (``EntropyGRPOConfig``, whose
    ``entropy_control`` names the methods), its trainer ``EntropyGRPOTrainer``, which trains the parts a config
    names."""
    entries = [registry[name] for name in names]
    if len(entries) == 1 and not entries[0].defaults:
        return entries[0]
    return replace(
        entries[0],
        key=SEPARATOR.join(names),
        config_class=config_class,
        trainer_class=EntropyGRPOTrainer,
        description="; ".join(entry.description for entry in entries),
        defaults={"entropy_control": list(names), **method_defaults(names, entries)},
        variants={},
        acts_on=tuple(place for entry in entries for place in entry.acts_on),
        metrics=tuple(dict.fromkeys(metric for entry in entries for metric in entry.metrics)),
        neutral=Neutral(),  # each method's neutral settings are its own entry's
        needs_all_ranks_rewards=any(entry.needs_all_ranks_rewards for entry in entries),
        moves_per_micro_batch=any(entry.moves_per_micro_batch for entry in entries),
        normalises_per_micro_batch=any(entry.normalises_per_micro_batch for entry in entries),
        needs_ppo_clip=any(entry.needs_ppo_clip for entry in entries),
        replaces_ppo_clip=any(entry.replaces_ppo_clip for entry in entries),
        exports=(),
        sweep=None,  # a combination sweeps its methods' grids (examples/toy_sweep.py)
    )


def refuse_contradicted_name(name: str, key: str, value, registry: dict[str, MethodSpec]) -> None:
    """A registry name that stands for a choice (a variant's name, for its variant field's value) refuses another
    value, naming the registry names that stand for the value set."""
    own = registry[name].config_class
    fitting = [
        other
        for other, entry in registry.items()
        if entry.config_class is own and entry.defaults.get(key, default_of(own.__dataclass_fields__[key])) == value
    ]
    instead = f"name {' or '.join(map(repr, fitting))} instead" if fitting else f"leave {key} out"
    raise ValueError(
        f"entropy_control names {name!r}, which stands for {key}={registry[name].defaults[key]!r}, but "
        f"{key}={value!r} is set: {instead}."
    )


def default_of(declared: Field):
    return declared.default_factory() if declared.default is MISSING else declared.default


def method_defaults(names, entries: list[MethodSpec]) -> dict:
    """The defaults the methods ``names`` give fields: their registry names' and their configs' for fields of the base
    (ADAPO's ``epsilon_high``); two methods that give one field different defaults are refused."""
    base_fields = {item.name: item for item in fields(EntropyGRPOBaseConfig)}
    defaults: dict[str, tuple] = {}  # field -> (default, the method that sets it)
    for name, entry in zip(names, entries, strict=True):
        own = {item.name: item for item in fields(entry.config_class)}
        changed = {key: default_of(own[key]) for key in base_fields if own[key] is not base_fields[key]}
        for key, value in {**changed, **entry.defaults}.items():
            if key in defaults and defaults[key][0] != value:
                raise ValueError(
                    f"{defaults[key][1]!r} and {name!r} set {key} to different defaults ({defaults[key][0]!r} and "
                    f"{value!r}): they cannot be combined."
                )
            defaults[key] = (value, name)
    return {key: value for key, (value, _) in defaults.items()}


def owners_of_fields(registry: dict[str, MethodSpec]) -> dict[str, list[str]]:
    """Each field that a method's config adds to the base's -> the names of the methods whose config has it."""
    base = set(EntropyGRPOBaseConfig.__dataclass_fields__)
    owners: dict[str, list[str]] = {}
    for name, entry in registry.items():
        for declared in fields(entry.config_class):
            if declared.name not in base:
                owners.setdefault(declared.name, []).append(name)
    return owners
