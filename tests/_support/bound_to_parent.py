"""Run a module (``-m NAME ARGS...``) or a script (``PATH ARGS...``) as this process, bound to its parent: on Linux the
kernel kills it (SIGKILL, PR_SET_PDEATHSIG) when the parent ends, however the parent ends (a signal, a kill, a time
limit). ``launch_two_processes`` (``distributed_run.py``) starts the launcher and each rank this way, so that a launch
ends with the test process that started it: the ranks run in sessions of their own (torchrun's), which no signal to
the test run's process group reaches, and otherwise outlived it, polling for jobs.

The parent's pid comes in ``TRL_ENTROPY_PARENT_PID`` from the process that starts this one (which may have ended
before this one could bind itself: then this one ends at once); this one sets it to its own pid for its children.

The kernel ties the binding to the parent's thread that started this process: a launch started from a thread that
ends is killed with it. The tests start launches from their main thread.
"""

import ctypes
import os
import runpy
import signal
import sys


PARENT_PID = "TRL_ENTROPY_PARENT_PID"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def bind_to_parent() -> None:
    """Be killed when the parent ends (Linux; elsewhere this process may outlive it)."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
        if os.getppid() != int(os.environ[PARENT_PID]):  # the parent ended before the binding: no signal will come
            sys.exit(f"the parent process {os.environ[PARENT_PID]} ended before this one bound itself to it")
    os.environ[PARENT_PID] = str(os.getpid())


if __name__ == "__main__":
    bind_to_parent()
    if sys.argv[1] == "-m":
        sys.argv = sys.argv[2:]  # run_module puts the module's file in sys.argv[0]
        sys.path[0] = os.getcwd()  # as ``python -m`` has it: this file's folder's modules would shadow others
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[1:]
        sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))  # as if the script were run itself
        runpy.run_path(sys.argv[0], run_name="__main__")
