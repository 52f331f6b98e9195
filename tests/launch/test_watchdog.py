"""``_support/watchdog.py``, the tests' hang detector in place of timeouts: a blocked child and a spinning one are
stopped and named with the Python stack they hung in; a child slower than either limit in total, but making
progress, is not stopped. The limits here are seconds, to keep the cases short; the suite's are minutes."""

import sys

import pytest
from _support.watchdog import Hung, run_watched


def run_python(code: str, **limits):
    return run_watched([sys.executable, "-c", code], "the child under test", **limits)


def test_a_blocked_child_is_stopped_and_named_with_its_stack():
    """It waits 5 minutes, then ends: a watchdog that missed it would return, not raise."""
    code = "import threading\ndef waiting():\n    threading.Event().wait(300)\nprint('started')\nwaiting()"
    with pytest.raises(Hung) as hung:
        run_python(code, stall_seconds=3)
    message = str(hung.value)
    assert message.startswith("the child under test hung (blocked: no CPU time and no output for "), message
    assert "started" in message and "in waiting" in message, message  # its output and faulthandler's stack


def test_a_spinning_child_is_stopped_and_named_with_its_stack():
    """It spins for 60 s of CPU time, then ends: a watchdog that missed it would return, not raise."""
    code = (
        "import time\n"
        "def spinning():\n"
        "    while time.process_time() < 60:\n"
        "        pass\n"
        "print('started')\n"
        "spinning()\n"
    )
    with pytest.raises(Hung) as hung:
        run_python(code, silent_cpu_seconds=2)
    message = str(hung.value)
    assert message.startswith("the child under test hung (spinning: "), message
    assert "s of CPU time without output)" in message and "in spinning" in message, message


def test_a_slow_child_making_progress_is_not_stopped():
    """Six rounds of 0.5 s of CPU time and 1 s asleep, each ending with a line: 3 s of CPU time and 9 s in all,
    past both limits, but never 2 s of CPU time without output nor 5 s with neither CPU time nor output."""
    code = (
        "import time\n"
        "for round in range(6):\n"
        "    start = time.process_time()\n"
        "    while time.process_time() - start < 0.5:\n"
        "        pass\n"
        "    print('round', round, flush=True)\n"
        "    time.sleep(1)\n"
    )
    done = run_python(code, stall_seconds=5, silent_cpu_seconds=2)
    assert done.returncode == 0 and done.stdout.count("round") == 6, done.stdout + done.stderr
