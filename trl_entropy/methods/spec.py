"""What a method declares about itself, once, at the end of its module (``SPEC = MethodSpec(...)``).

The registry (``methods/__init__.py``) is built from these declarations, and everything that lists methods reads it:
the public names, the command line's ``--method``, the report's panels, the model cards and the tests' tables.
"""

import itertools
from dataclasses import dataclass, field, replace

from ..core.citation import Paper
from ..core.places import Place
from ..core.trl.bridge import model_card_of


@dataclass(frozen=True)
class Metric:
    """A value the method logs. ``title``: its own panel in the run report (``ylabel`` on the y axis; ``smooth``: a
    measured, noisy fraction, drawn faint with its moving average, rather than a controller's state drawn as logged);
    None: no panel. ``target_label``: an entropy target, drawn dashed on the report's entropy panel with this label."""

    key: str
    title: str | None = None
    ylabel: str = ""
    smooth: bool = False
    target_label: str | None = None


@dataclass(frozen=True)
class Neutral:
    """The settings that make the method compute exactly ``trl.GRPOTrainer``'s loss step: ``ours`` on the method's
    config, ``trl`` on ``trl.GRPOConfig``; ``trl_with_ppo_clip``, where given, replaces ``trl`` for the loss types with
    the PPO clip (``core.objectives.PPO_CLIP_LOSS_TYPES``)."""

    ours: dict = field(default_factory=dict)
    trl: dict = field(default_factory=dict)
    trl_with_ppo_clip: dict | None = None

    def trl_options(self, ppo_clip: bool) -> dict:
        return self.trl_with_ppo_clip if ppo_clip and self.trl_with_ppo_clip is not None else self.trl


@dataclass(frozen=True)
class Sweep:
    """The values ``examples/toy_sweep.py`` tries for the method on the toy task (docs/demo.md), each point one run.

    ``grid``: {config field: values}, every combination (the last field varying fastest), or [{config field: value},
    ...], these points only, in this order (for fields that go in pairs, such as a band's two ends). ``fixed``: the
    settings every point shares, the rest of the method's ``examples/configs`` YAML but ``num_iterations`` (the demo's
    recipe already trains every run with ``num_iterations=2``)."""

    grid: dict[str, list] | list[dict]
    fixed: dict = field(default_factory=dict)

    def points(self) -> list[dict]:
        """The config values of every run, in the order they run."""
        if isinstance(self.grid, dict):
            return [dict(zip(self.grid, values, strict=True)) for values in itertools.product(*self.grid.values())]
        return [dict(point) for point in self.grid]

    def fields(self) -> list[str]:
        """The config fields the sweep sets: those it varies, then those it fixes."""
        return list(dict.fromkeys(key for point in [*self.points(), self.fixed] for key in point))


@dataclass(frozen=True)
class MethodDocs:
    """What the docs' lists of methods say of a method, in the regions ``docs/tables.py`` writes. ``summary``: what it
    controls (the README's table of trainers, docs/README.md's index of pages, docs/references.md); ``choose_when``:
    what a user who should take it wants (docs/getting_started.md's "Which method"); ``sources``: where its formula
    and defaults come from, where not from the paper alone (docs/references.md)."""

    summary: str = ""
    choose_when: str = ""
    sources: str = ""


@dataclass(frozen=True)
class Variant:
    """One name of a method in the registry: what ``--method`` lists, and the config settings it stands for.

    ``metrics``: the keys of the method's metrics this name logs (None: all of them). ``neutral``: this name's neutral
    settings where they differ from the method's. ``sweep``: this name's toy sweep (None: the method's). ``acts_on``:
    the places this name acts on where they differ from the method's (its first is the axis it takes). ``docs``: what
    the docs' lists say of this name where it differs from the method's."""

    description: str
    defaults: dict = field(default_factory=dict)
    metrics: tuple[str, ...] | None = None
    neutral: Neutral | None = None
    sweep: Sweep | None = None
    acts_on: tuple[Place, ...] | None = None
    docs: MethodDocs | None = None


@dataclass(frozen=True)
class MethodSpec:
    """A method's declaration, and, for each of its names, its entry in the registry.

    ``key`` names the method (its module, its metrics' prefix). ``description`` and ``defaults`` (config settings the
    name stands for) describe it under its own name; ``variants``, where given, are its names in the registry instead.
    ``name``, ``paper`` and ``tag`` are its trainer's (the literal ``_name``, ``paper`` and last of ``_tag_names`` its
    model card shows; no paper: the base's own trainer, signed as GRPO).
    ``acts_on``: the places of the step its part fills (``core.places.PLACES``), its axis first. ``metrics``: what
    any of its names logs (a variant may log fewer). ``exports``: the module's public names beyond
    the config and the trainer. ``needs_all_ranks_rewards``: the method reads every rank's rewards, not only its own.
    ``moves_per_micro_batch``: its controller moves at every training micro-batch (a controller of cadence
    ``"micro_batch"``), not once per generation cycle, so its trajectory depends on how the cycle is
    cut into micro-batches. ``normalises_per_micro_batch``: its loss reads statistics of the micro-batch it is given
    (STEER's range of ``|Ω|``, as its authors compute it), so the same tokens cut into other micro-batches give
    another loss. ``needs_ppo_clip``: it acts through the PPO clip of the loss type (moves its bound, or
    selects by where it binds); ``replaces_ppo_clip``: its surrogate has no PPO clip. The two never combine.
    ``sweep``: the values ``examples/toy_sweep.py`` tries on the toy task (None: the method is not swept).
    ``docs``: what the docs' lists of methods say of it (``MethodDocs``). ``short_run_settings``: settings under which
    every metric of the method moves within a few toy steps, where its defaults would not (the tests' short runs
    compare those metrics across layouts and processes).
    """

    key: str
    config_class: type
    trainer_class: type
    description: str = ""
    defaults: dict = field(default_factory=dict)
    variants: dict[str, Variant] = field(default_factory=dict)
    acts_on: tuple[Place, ...] = ()
    metrics: tuple[Metric, ...] = ()
    neutral: Neutral = field(default_factory=Neutral)
    needs_all_ranks_rewards: bool = False
    moves_per_micro_batch: bool = False
    normalises_per_micro_batch: bool = False
    needs_ppo_clip: bool = False
    replaces_ppo_clip: bool = False
    exports: tuple[type, ...] = ()
    sweep: Sweep | None = None
    docs: MethodDocs = field(default_factory=MethodDocs)
    short_run_settings: dict = field(default_factory=dict)

    def entries(self) -> dict[str, "MethodSpec"]:
        """The registry's entries for this method: one per variant (its description and defaults), or itself."""
        if not self.variants:
            return {self.key: self}
        return {name: self.variant_entry(variant) for name, variant in self.variants.items()}

    def variant_entry(self, variant: Variant) -> "MethodSpec":
        metrics = self.metrics
        if variant.metrics is not None:
            unknown = sorted(set(variant.metrics) - {metric.key for metric in self.metrics})
            if unknown:
                raise ValueError(f"{self.key}: a variant names metrics the method does not declare: {unknown}")
            metrics = tuple(metric for metric in self.metrics if metric.key in variant.metrics)
        return replace(
            self,
            description=variant.description,
            defaults=variant.defaults,
            metrics=metrics,
            neutral=variant.neutral or self.neutral,
            sweep=variant.sweep or self.sweep,
            acts_on=variant.acts_on or self.acts_on,
            docs=variant.docs or self.docs,
            variants={},
        )

    @property
    def paper(self) -> Paper | None:
        return self.trainer_class.paper

    @property
    def name(self) -> str | None:
        return None if self.paper is None else model_card_of(self.trainer_class)[0]

    @property
    def tag(self) -> str | None:
        return None if self.paper is None else model_card_of(self.trainer_class)[1][-1]

    @property
    def public(self) -> dict[str, type]:
        """The public names this method adds to ``trl_entropy``: its config, its trainer and its exports."""
        return {item.__name__: item for item in (self.config_class, self.trainer_class, *self.exports)}
