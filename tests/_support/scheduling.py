"""How the suite splits over two workers (``-n 2 --dist loadfile``, the README's command).

* A file is one unit of work, so that its module fixtures (a trained run, a launch) are built on one worker, once.
  The files whose tests use the two ranks (the ``two_ranks`` fixture, ``_support/rank_pool.py``) make one unit
  together, so that one worker starts the ranks, once.
* A worker takes the next unit when it is free, so the longest units go out first: those holding a launch-tier test
  (subprocesses and two-process runs, tens of seconds each), then the others by their number of tests. Left to itself,
  xdist orders the units by their number of tests only, which sent the few-test launch files out last, to run while
  the other worker idled.
"""

import functools
from collections import Counter
from pathlib import Path


TWO_RANKS = "two_ranks"
TESTS = Path(__file__).resolve().parents[1]


@functools.cache
def two_rank_files() -> frozenset[str]:
    """The test files that request the ``two_ranks`` fixture (the fixture's name appears in their source), as node
    ids name them."""
    root = TESTS.parent
    return frozenset(
        path.relative_to(root).as_posix() for path in TESTS.rglob("test_*.py") if TWO_RANKS in path.read_text()
    )


def unit_of(nodeid: str) -> str:
    file = nodeid.split("::")[0]
    return TWO_RANKS if file in two_rank_files() else file


def order_units(items: list) -> None:
    """Put ``items`` in the order the workers should take their units (a unit's tests keep their order)."""
    units = [unit_of(item.nodeid) for item in items]
    sizes = Counter(units)
    launches = Counter(unit for unit, item in zip(units, items) if item.get_closest_marker("launch"))
    first_seen = {unit: index for index, unit in reversed(list(enumerate(units)))}
    rank = {unit: (launches[unit] == 0, -sizes[unit], first_seen[unit]) for unit in sizes}
    items.sort(key=lambda item: rank[unit_of(item.nodeid)])


def make_scheduler(config, log):
    """xdist's file scheduling with these units, in the order the workers collected them (:func:`order_units`)."""
    from xdist.scheduler import LoadFileScheduling

    class UnitScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False  # the order is order_units'
    return UnitScheduling(config, log)
