"""Hang detection for the processes a test waits on, by what they do rather than by the clock, so that a test fails
for hanging and never for being slow: a busy machine stretches a run's wall time, not its CPU time nor its output.

A watched process (its descendants included) has hung when it is

* blocked: neither its CPU time nor its output grew for ``STALL_SECONDS``. A process that runs, however busy the
  machine, gets CPU time within seconds; one waiting on a lock, a pipe or a peer that never answers gets none;
* spinning: it used ``SILENT_CPU_SECONDS`` of CPU time without writing a byte (a loop that never ends).

Either limit is far above what a correct run comes near. Measured with both cores busy besides (the kernels, the
launches, the subprocess and two-rank tests, twice): 19 s of CPU time at most without output (a case of the Triton
interpreter's re-run) and 13 s at most without either (the GPU runbook's dry run).

A hung process's Python stacks are dumped into its output (SIGABRT, which faulthandler answers; :func:`run_watched`
and the launches turn it on) before it is ended, so that the failure names what hung and where.
"""

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import psutil


STALL_SECONDS = 600.0
SILENT_CPU_SECONDS = 1800.0
SAMPLE_SECONDS = 1.0  # the process table is read at most this often (a few ms a read)
DUMP_SECONDS = 30.0  # how long aborted processes get to write their stacks and end
# the child's side of run_watched: stacks dumped on SIGABRT, output written as it comes (progress the watchdog sees)
WATCHED_ENV = {"PYTHONFAULTHANDLER": "1", "PYTHONUNBUFFERED": "1"}


class Hung(AssertionError):
    """A watched process stopped making progress (see the module)."""


def running(process: psutil.Process) -> bool:
    """Whether ``process`` runs (a zombie, ended but not yet reaped, does not; psutil tells a new process that took its
    id from it)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def survivors(processes: Iterable[psutil.Process], grace_seconds: float = 60.0) -> list[psutil.Process]:
    """Those of ``processes`` still running after ``grace_seconds`` at most: the check that they were ended. The
    kernel ends a killed process at once; the grace only covers a busy machine."""
    deadline = time.monotonic() + grace_seconds
    while (left := [process for process in processes if running(process)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def tree(roots: Iterable[int], *, with_roots: bool = True) -> list[psutil.Process]:
    """The running processes ``roots`` (unless ``with_roots`` is false) and every running process under them."""
    found = []
    for pid in roots:
        try:
            root = psutil.Process(pid)
            found += [root] if with_roots else []
            found += root.children(recursive=True)
        except psutil.NoSuchProcess:
            continue
    return [process for process in found if running(process)]


def kill_tree(roots: Iterable[int]) -> None:
    """SIGKILL ``roots`` and every process under them (all found first, then killed)."""
    for process in tree(roots):
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


class Watchdog:
    """Watches the processes ``roots`` and their descendants, and the files ``outputs`` they write; :meth:`hung` and
    :meth:`check` say once they have stopped making progress. With ``count_roots=False`` only the descendants' CPU
    time counts: a launcher (torchrun's agent polls its workers every 0.1 s) spends CPU time while its workers hang.
    ``what`` names them in the failure."""

    def __init__(
        self,
        what: str,
        roots: Iterable[int],
        outputs: Iterable[Path] = (),
        *,
        count_roots: bool = True,
        stall_seconds: float = STALL_SECONDS,
        silent_cpu_seconds: float = SILENT_CPU_SECONDS,
    ):
        self.what, self.roots, self.count_roots = what, list(roots), count_roots
        self.outputs = [Path(path) for path in outputs]
        self.stall_seconds, self.silent_cpu_seconds = stall_seconds, silent_cpu_seconds
        self.sampled = self.progressed = time.monotonic()
        self.watched, self.cpu, self.sizes = self._sample()
        self.silent_cpu = 0.0  # CPU seconds since the outputs last grew

    def _sample(self) -> tuple[list[psutil.Process], dict, list[int]]:
        """The watched processes, each one's CPU seconds by (pid, start time), and the outputs' sizes."""
        watched, cpu = tree(self.roots, with_roots=self.count_roots), {}
        for process in watched:
            try:
                times = process.cpu_times()
                cpu[process.pid, process.create_time()] = times.user + times.system
            except psutil.NoSuchProcess:
                continue
        return watched, cpu, [path.stat().st_size if path.exists() else 0 for path in self.outputs]

    def hung(self) -> str | None:
        """None while the processes make progress; once they stop, their stacks dumped into their outputs (they are
        aborted) and what hung and how."""
        now = time.monotonic()
        if now - self.sampled < SAMPLE_SECONDS:
            return None
        self.sampled = now
        watched, cpu, sizes = self._sample()
        used = sum(max(0.0, seconds - self.cpu.get(key, 0.0)) for key, seconds in cpu.items())
        wrote = sizes != self.sizes
        self.silent_cpu = 0.0 if wrote else self.silent_cpu + used
        if used or wrote:
            self.progressed = now
        self.watched, self.cpu, self.sizes = watched, cpu, sizes
        if now - self.progressed > self.stall_seconds:
            reason = f"blocked: no CPU time and no output for {now - self.progressed:.0f} s"
        elif self.silent_cpu > self.silent_cpu_seconds:
            reason = f"spinning: {self.silent_cpu:.0f} s of CPU time without output"
        else:
            return None
        self._dump_stacks()
        return f"{self.what} hung ({reason})"

    def check(self) -> None:
        """Raise :class:`Hung`, with the outputs' tails, once the processes have stopped making progress."""
        reason = self.hung()
        if reason is not None:
            tails = "\n".join(f"--- {path} ---\n{path.read_text(errors='replace')[-6000:]}" for path in self.outputs)
            raise Hung(f"{reason}\n{tails}")

    def _dump_stacks(self) -> None:
        for process in self.watched:
            try:
                process.send_signal(signal.SIGABRT)
            except psutil.NoSuchProcess:
                pass
        deadline = time.monotonic() + DUMP_SECONDS  # the run has failed already: this wait decides nothing
        while any(running(process) for process in self.watched) and time.monotonic() < deadline:
            time.sleep(0.1)


def run_watched(
    command: list, what: str, *, cwd=None, env: dict | None = None, check: bool = False, **limits
) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True, check=check)`` with a :class:`Watchdog` in place of
    a timeout: raises :class:`Hung` (naming ``what``) if the command stops making progress; ``limits`` are its
    ``stall_seconds`` and ``silent_cpu_seconds``."""
    env = {**(os.environ if env is None else env), **WATCHED_ENV}
    with tempfile.TemporaryDirectory() as folder:
        outputs = [Path(folder) / "stdout", Path(folder) / "stderr"]
        with open(outputs[0], "w") as stdout, open(outputs[1], "w") as stderr:
            process = subprocess.Popen(
                command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr
            )
        try:
            watchdog = Watchdog(what, [process.pid], outputs, **limits)
            while process.poll() is None:
                watchdog.check()
                time.sleep(0.05)
        finally:
            if process.poll() is None:
                kill_tree([process.pid])
                process.wait()
        done = subprocess.CompletedProcess(command, process.returncode, *(path.read_text() for path in outputs))
    if check:
        done.check_returncode()
    return done


def join_watched(processes: list, what: str, outputs: Iterable[Path] = ()) -> None:
    """Join ``multiprocessing`` processes with a :class:`Watchdog` in place of a timeout (raises :class:`Hung`); any
    still running when it fires (or when the wait is interrupted) are killed."""
    try:
        watchdog = Watchdog(what, [process.pid for process in processes], outputs)
        while any(process.is_alive() for process in processes):
            watchdog.check()
            time.sleep(0.05)
    finally:
        for process in processes:
            if process.is_alive():
                kill_tree([process.pid])
            process.join()


def run_together(call, what: str, count: int = 2) -> None:
    """``call()`` in ``count`` forked processes released at the same moment (a barrier), joined with
    :func:`join_watched`; each must exit cleanly. The processes inherit the caller's monkeypatches."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    start = context.Barrier(count)

    def caller():
        start.wait()
        call()

    processes = [context.Process(target=caller) for _ in range(count)]
    for process in processes:
        process.start()
    join_watched(processes, what)
    assert [process.exitcode for process in processes] == [0] * count
