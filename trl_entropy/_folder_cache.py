"""A model folder built once and shared: the warm-started toy policy (:mod:`trl_entropy.toy`) and the converted
pretrained checkpoints (:mod:`trl_entropy.pretrained`) are both saved this way."""

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def build_folder_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Return ``target``, a model folder (it holds ``config.json`` once complete), calling ``build(staging)`` to write
    it the first time.

    ``build`` writes into a fresh staging folder beside ``target``, which is then renamed to ``target``, so a reader
    never sees a half-written folder. A lock file beside it (``<target>.lock``) makes concurrent callers (test workers,
    the demo's workers) wait for the first one's folder instead of each building it (POSIX ``flock``; where there is
    none, each may build it, and the first rename wins).
    """
    target = Path(target)
    if not (target / "config.json").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with _exclusive(target.parent / (target.name + ".lock")):
            if not (target / "config.json").exists():
                _build_and_rename(target, build)
    return target


def _build_and_rename(target: Path, build: Callable[[Path], None]) -> None:
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".tmp", dir=target.parent))
    try:
        build(staging)
        try:
            os.rename(staging, target)
        except OSError:  # another process (without the lock: another platform) won the race; its copy is equivalent
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _exclusive(lock_path: Path):
    """Hold an exclusive lock on ``lock_path`` (POSIX ``flock``; where there is none, no lock is taken)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
