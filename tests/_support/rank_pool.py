"""Two ranks started once (``accelerate launch --multi_gpu``: torchrun, two CPU processes, gloo) that run the tests'
two-process jobs one after another, so that a test process pays the launch (about 15 s of imports on two cores) once
rather than at every two-process check.

A job is a module-level function and JSON arguments; both ranks call it, each in its own process, as a rank script
would. The tests reach the pool through the session fixture ``two_ranks`` (``tests/conftest.py``):

    job = two_ranks.submit(distributed_run.main, ["--model", path, "--out", folder])
    ...  # the one-process side runs here meanwhile
    job.wait()

Run as a script (what :class:`RankPool` launches), each rank waits for ``job<n>.json`` in its folder, runs it, and
marks it ``job<n>.rank<k>.done``. A job that raises on a rank writes ``job<n>.rank<k>.failed`` (the traceback) and
ends that process; torchrun then stops the other rank, and the next job starts a new pool. A ``null`` job ends both
ranks cleanly. The launcher and the ranks end with the test process that started them, however it ends (a signal,
a kill, a time limit): each is bound to its parent (``bound_to_parent.py``).

Jobs run in launch order with whatever state earlier jobs left in the process: the default process group, accelerate's
shared state, the frozen heap of ``_support/process.py``. Each job builds its own trainer from a fixed seed, as the
tests' one-process side does in one pytest process.
"""

import importlib
import inspect
import itertools
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from _support.watchdog import Watchdog


POLL_SECONDS = 0.02


def job_name(function) -> tuple[str, str, str | None]:
    """``(module, qualified name, folder to put on sys.path)`` of a module-level ``function``: a test module (imported
    by pytest under its bare name) is found through its folder; ``_support`` modules through ``tests/``, which every
    rank has on its path."""
    if "<locals>" in function.__qualname__:
        raise ValueError(f"{function.__qualname__} is local to a function: a rank cannot import it")
    module = function.__module__
    folder = None if "." in module else os.path.dirname(os.path.abspath(inspect.getfile(function)))
    return module, function.__qualname__, folder


class Job:
    """A job handed to both ranks; :meth:`wait` returns once both have run it, or raises with the ranks' log."""

    def __init__(self, pool: "RankPool", index: int, name: str):
        self.pool, self.index, self.name = pool, index, name

    def wait(self) -> None:
        self.pool.wait(self)


class RankPool:
    """The client: starts the two ranks at the first job (again after a job failed), hands them jobs, stops them."""

    def __init__(self, make_folder):
        self.make_folder = make_folder  # a fresh folder for each pool started
        self.launched = None
        self.folder = None
        self.jobs = 0

    def alive(self) -> bool:
        return self.launched is not None and self.launched.poll() is None

    def submit(self, function, *args) -> Job:
        """Hand ``function(*args)`` to both ranks (after the jobs handed before it)."""
        from _support.distributed_run import launch_two_processes

        if not self.alive():
            self.stop()
            self.folder, self.jobs = Path(self.make_folder()), 0
            self.launched = launch_two_processes(Path(__file__), [str(self.folder)], self.folder)
        module, qualname, folder = job_name(function)
        index, self.jobs = self.jobs, self.jobs + 1
        self._write(index, {"module": module, "function": qualname, "path": folder, "args": list(args)})
        return Job(self, index, f"{module}.{qualname}")

    def run(self, function, *args) -> None:
        """:meth:`submit` and wait."""
        self.submit(function, *args).wait()

    def wait(self, job: Job) -> None:
        """Return once both ranks have run ``job``; raise if one failed, if they exited, or if they hung
        (``_support/watchdog.py``: no progress, however long a slow machine takes to make it)."""
        log = self.folder / "launch.log"
        watchdog = Watchdog(f"two-process job {job.name}", [self.launched.pid], [log], count_roots=False)
        while not self._done(job.index):
            problem = None
            failed = [self.folder / f"job{job.index}.rank{rank}.failed" for rank in (0, 1)]
            if any(path.exists() for path in failed):
                problem = "\n".join(path.read_text() for path in failed if path.exists())
            elif self.launched.poll() is not None:
                problem = f"the ranks exited ({self.launched.returncode}) before finishing it"
            else:
                problem = watchdog.hung()
            if problem is not None:
                self.stop()
                raise AssertionError(
                    f"two-process job {job.name} failed: {problem}\nthe ranks' log:\n{log.read_text()[-6000:]}"
                )
            time.sleep(POLL_SECONDS)

    def _done(self, index: int) -> bool:
        return all((self.folder / f"job{index}.rank{rank}.done").exists() for rank in (0, 1))

    def stop(self) -> None:
        """End both ranks: cleanly when they are idle and well; by killing the launcher otherwise (a job still running
        is not waited for), which ends the ranks too (they are bound to it, ``bound_to_parent.py``)."""
        if self.launched is None:
            return
        from _support.distributed_run import finish

        launched, self.launched = self.launched, None
        if launched.poll() is None and all(self._done(index) for index in range(self.jobs)):
            self._write(self.jobs, None)
            try:
                finish(launched, self.folder)
                return
            except AssertionError:
                pass
        if launched.poll() is None:
            os.killpg(launched.pid, signal.SIGKILL)
            launched.wait()

    def _write(self, index: int, job: dict | None) -> None:
        staging = self.folder / f"job{index}.json.tmp"
        staging.write_text(json.dumps(job))
        os.replace(staging, self.folder / f"job{index}.json")  # a rank never reads half a job


def call(job: dict) -> None:
    if job["path"] is not None and job["path"] not in sys.path:
        sys.path.insert(0, job["path"])
    target = importlib.import_module(job["module"])
    for part in job["function"].split("."):
        target = getattr(target, part)
    target(*job["args"])


def serve(folder: Path) -> None:
    """Run the jobs written into ``folder``, in order, until the ``null`` job."""
    import torch

    from _support.distributed_run import end_rank_cleanly
    from _support.process import lighten

    torch.set_num_threads(1)
    lighten()
    rank = int(os.environ["RANK"])
    for index in itertools.count():
        request = folder / f"job{index}.json"
        while not request.exists():
            time.sleep(POLL_SECONDS)
        job = json.loads(request.read_text())
        if job is None:
            break
        try:
            call(job)
        except BaseException:
            (folder / f"job{index}.rank{rank}.failed").write_text(f"rank {rank}:\n{traceback.format_exc()}")
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        (folder / f"job{index}.rank{rank}.done").touch()
    end_rank_cleanly(rank)


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
