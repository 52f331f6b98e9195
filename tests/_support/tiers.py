"""Tier markers by cost. Every test gets one: `pure` (pure functions, configs, source checks), `loss_step` (one loss
step or scoring pass against float64 or trl.GRPOTrainer), `training` (short in-process training), `launch`
(subprocesses and multi-process launches); `-m "pure or loss_step"` is the quick loop (docs/testing.md).

Each folder's conftest.py names its default tier, the files that differ, the single tests that differ from their
file and the launches one by one; a tier may be a rule, a function of the test item (:func:`by_model`).
:class:`TierCheck` holds every tier but a launch to what its test did, so that no cost hides behind a folder's or a
file's tier: a `training` test must train or start a process, a quick-loop test must not train (it may start a
process: git, a compiler), and a `pure` test builds no trainer. A conftest names its deliberate exceptions (a short
run kept in the quick loop, say), each with its reason."""

import functools
import os
import subprocess

import pytest


QUICK_LOOP = ("pure", "loss_step")
# A test's tier, and whether TierCheck holds it to the test's cost.
TIER = pytest.StashKey[tuple[str, bool]]()
COUNTS_BEFORE = pytest.StashKey[tuple[tuple[int, ...], tuple[int, ...]]]()
# The fixtures that give a test a model: a test given one scores or trains it.
MODEL_FIXTURES = {"toy_model_path", "warm_toy_policy_path", "toy_tokenizer", "smollm2_path"}


def by_model(item) -> str:
    """``loss_step`` for a test given a model (:data:`MODEL_FIXTURES`, directly or through its fixtures), else
    ``pure``."""
    return "loss_step" if MODEL_FIXTURES & set(item.fixturenames) else "pure"


def mark_tier(item, default, files=None, launches=None, tests=None, unchecked=None):
    """Give ``item`` its tier: ``launch`` if its file's entry in ``launches`` is ``"all"`` or names the test, else the
    tier its file's entry in ``tests`` (``{test name: tier}``) gives the test, else its file's tier in ``files``, else
    ``default``. A tier is a name or a function of the item that returns one. ``unchecked`` (``{file: test names}``):
    the deliberate exceptions :class:`TierCheck` leaves alone."""
    file = item.path.name
    named = (launches or {}).get(file, ())
    if named == "all" or item.originalname in named:
        tier = "launch"
    else:
        tier = (tests or {}).get(file, {}).get(item.originalname) or (files or {}).get(file, default)
        tier = tier(item) if callable(tier) else tier
    item.add_marker(getattr(pytest.mark, tier))
    item.stash[TIER] = (tier, tier != "launch" and item.originalname not in (unchecked or {}).get(file, ()))


# What this process has done so far: trainings (Trainer.train calls, and forks: a forked child runs what its parent
# would), subprocesses started, trainers built.
_counts = {"trains": 0, "processes": 0, "trainers": 0}


def counts() -> tuple[int, ...]:
    return tuple(_counts.values())


def _counted(function, what: str):
    @functools.wraps(function)
    def counting(*arguments, **keywords):
        _counts[what] += 1
        return function(*arguments, **keywords)

    counting.counted = True
    return counting


def count_costs() -> None:
    """Count every ``transformers.Trainer`` trained and built, fork and subprocess from now on (once per process: a
    nested pytest session finds them counted already)."""
    import transformers

    if getattr(transformers.Trainer.train, "counted", False):
        return
    transformers.Trainer.train = _counted(transformers.Trainer.train, "trains")
    transformers.Trainer.__init__ = _counted(transformers.Trainer.__init__, "trainers")
    os.fork = _counted(os.fork, "trains")
    subprocess.Popen.__init__ = _counted(subprocess.Popen.__init__, "processes")


def cost_contradiction(tier: str, trains: bool, starts_processes: bool, builds_trainer: bool) -> str | None:
    """What a test of ``tier`` that did this contradicts (None: nothing)."""
    if tier == "training" and not (trains or starts_processes):
        return "is in the training tier but neither trains nor starts a process: the quick loop should run it"
    if tier in QUICK_LOOP and trains:
        return f"is in the quick loop ({tier}) but trains"
    if tier == "pure" and builds_trainer:
        return "is pure but builds a trainer: its cost is a loss step's"
    return None


class TierCheck:
    """Fails a passed test whose tier its cost contradicts (see the module). A test trains when it, or a fixture it
    uses (a module's trained run, which an earlier test may have set up), calls ``Trainer.train`` or starts a process.
    A session's fixtures are set up once for every test (the toy policy, the real model fetched with pip): their costs
    are no test's."""

    def __init__(self):
        self.costly_fixtures = {what: set() for what in _counts}  # fixture definitions by what their set-up did
        self.session_costs = (0,) * len(_counts)  # what the session's fixtures did, as counts() counts it

    def own_costs(self, before: tuple[int, ...], session_before: tuple[int, ...]) -> list[int]:
        """What was done since ``before`` (the session fixtures' costs then: ``session_before``), theirs left out."""
        return [
            now - earlier - (session_now - session_earlier)
            for now, earlier, session_now, session_earlier in zip(
                counts(), before, self.session_costs, session_before, strict=True
            )
        ]

    def pytest_collection_finish(self, session):
        count_costs()  # after the imports: counting costs nothing they do

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        before, session_before = counts(), self.session_costs
        try:
            return (yield)
        finally:
            costs = self.own_costs(before, session_before)
            if fixturedef.scope == "session":
                self.session_costs = tuple(total + cost for total, cost in zip(self.session_costs, costs, strict=True))
            else:
                for what, cost in zip(self.costly_fixtures, costs, strict=True):
                    if cost > 0:
                        self.costly_fixtures[what].add(fixturedef)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        item.stash[COUNTS_BEFORE] = (counts(), self.session_costs)
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        if call.when != "call" or not report.passed or TIER not in item.stash:
            return report
        tier, checked = item.stash[TIER]
        if not checked:
            return report
        fixtures = [fixture for fixtures in item._fixtureinfo.name2fixturedefs.values() for fixture in fixtures]
        did = [
            cost > 0 or not self.costly_fixtures[what].isdisjoint(fixtures)
            for what, cost in zip(self.costly_fixtures, self.own_costs(*item.stash[COUNTS_BEFORE]), strict=True)
        ]
        contradiction = cost_contradiction(tier, *did)
        if contradiction is not None:
            report.outcome = "failed"
            report.longrepr = (
                f"{item.nodeid} {contradiction}. Give it the tier of its cost in {item.path.parent / 'conftest.py'} "
                "(docs/testing.md, Tiers), or name it there as a deliberate exception (UNCHECKED), saying why."
            )
        return report
