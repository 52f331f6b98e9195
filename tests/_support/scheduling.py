"""The order in which the suite's files go to the two workers (``-n 2 --dist loadfile --no-loadscope-reorder``, the
README's command).

A file is one unit of work, so that its module fixtures (a trained run, a launch) are built on one worker, once. A
worker takes the next file when it is free, so the longest files should go out first: those holding a launch-tier
test (subprocesses and two-process runs, tens of seconds each) first, then the others by their number of tests. Left
to itself, xdist orders the files by their number of tests only, which sent the few-test launch files out last, to
run while the other worker idled.
"""

from collections import Counter


def file_of(item) -> str:
    return item.nodeid.split("::")[0]


def order_files(items: list) -> None:
    """Put ``items`` in the order the workers should take their files (a file's tests keep their order)."""
    files = [file_of(item) for item in items]
    sizes = Counter(files)
    launches = Counter(name for name, item in zip(files, items) if item.get_closest_marker("launch"))
    first_seen = {name: index for index, name in reversed(list(enumerate(files)))}
    rank = {name: (launches[name] == 0, -sizes[name], first_seen[name]) for name in sizes}
    items.sort(key=lambda item: rank[file_of(item)])
