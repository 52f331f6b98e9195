"""The two ranks of ``_support/rank_pool.py`` end with the test process that started them, however it ends: SIGTERM,
SIGINT (pytest's KeyboardInterrupt, its fixtures torn down), SIGKILL, and a time limit (GNU ``timeout`` around a
``-n 1`` run, the way a stopped test run ends). A pool left behind holds two ranks of 640 MB each, polling for jobs.

Each case runs this file's ``test_owner`` in a pytest subprocess: it starts a pool and hands it a job that notes each
rank's process id and then blocks. Once both ranks run it, the case ends the owner and finds none of the processes
left that ran under it: the launcher, the ranks, and every other one found under the owner at that moment.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from _support.rank_pool import RankPool
from _support.watchdog import Watchdog, survivors, tree


ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the binding to a parent is Linux's PR_SET_PDEATHSIG")
OWNER_FOLDER = "TRL_ENTROPY_RANK_POOL_OWNER"  # where test_owner notes its launch; unset, it skips


def note_rank_and_block(folder: str) -> None:
    """The job: note this rank's process id, then block until killed."""
    (Path(folder) / f"rank{os.environ['RANK']}.pid").write_text(str(os.getpid()))
    threading.Event().wait()


@pytest.fixture
def pool(tmp_path):
    """A pool of its own, ended as the session's fixture ends its pool (``tests/conftest.py``); the session's would
    put this file with the files that share theirs, on one worker (``_support/scheduling.py``)."""
    started = RankPool(lambda: tmp_path / "ranks")
    yield started
    started.stop()


@pytest.mark.skipif(OWNER_FOLDER not in os.environ, reason="the owner process of the cases below")
def test_owner(pool):
    folder = Path(os.environ[OWNER_FOLDER])
    job = pool.submit(note_rank_and_block, str(folder))
    (folder / "owner.json").write_text(json.dumps({"owner": os.getpid(), "launcher": pool.launched.pid}))
    job.wait()  # until this process is ended


def end_by_signal(number):
    def end(started, owner_pid):
        os.kill(owner_pid, number)

    return end


def reach_the_time_limit(started, owner_pid):
    """GNU ``timeout`` takes SIGALRM as its limit reached (a day: no run gets there by itself): it sends its signal
    (TERM) to its process group."""
    started.send_signal(signal.SIGALRM)


# pytest, taking SIGINT as a user's Ctrl-C (KeyboardInterrupt) even where this run was started with SIGINT ignored, as
# a shell starts a background job (Python then leaves it ignored)
TAKE_SIGINT = (
    "import signal, sys, pytest\nsignal.signal(signal.SIGINT, signal.default_int_handler)\nsys.exit(pytest.main())\n"
)
PYTEST = [sys.executable, "-c", TAKE_SIGINT, "-q", "-p", "no:cacheprovider", f"{__file__}::test_owner"]
CASES = {
    "SIGTERM": (PYTEST, end_by_signal(signal.SIGTERM)),
    "SIGINT": (PYTEST, end_by_signal(signal.SIGINT)),
    "SIGKILL": (PYTEST, end_by_signal(signal.SIGKILL)),
    "time limit": (["timeout", "1d", *PYTEST, "-n", "1"], reach_the_time_limit),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_ranks_end_with_their_owner(case, tmp_path):
    command, end = CASES[case]
    if shutil.which(command[0]) is None:
        pytest.skip(f"needs {command[0]}")
    folder = tmp_path / "owner"
    folder.mkdir()
    output = tmp_path / "output.txt"
    with open(output, "w") as log:
        started = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, OWNER_FOLDER: str(folder)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    launched = []
    try:
        watchdog = Watchdog(f"the pool's owner ({case})", [started.pid], [output])
        noted = [folder / "owner.json", folder / "rank0.pid", folder / "rank1.pid"]
        while not all(path.exists() for path in noted):
            assert started.poll() is None, output.read_text()[-6000:]
            watchdog.check()
            time.sleep(0.1)
        owner = json.loads(noted[0].read_text())
        ranks = [int(path.read_text()) for path in noted[1:]]
        launched = tree([started.pid])
        pids = {process.pid for process in launched}
        assert {owner["owner"], owner["launcher"], *ranks} <= pids, (owner, ranks, pids)
        end(started, owner["owner"])
        left = [process.pid for process in survivors(launched)]
        assert left == [], f"{case}: still running: {left} (launcher {owner['launcher']}, ranks {ranks})"
        if case == "time limit":
            assert started.wait() == 124, output.read_text()[-6000:]  # what timeout returns at its limit
    finally:
        for process in [*tree([started.pid]), *survivors(launched, grace_seconds=0)]:
            with contextlib.suppress(psutil.NoSuchProcess):  # it ended meanwhile
                process.kill()
        started.wait()
