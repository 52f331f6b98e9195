"""The tiers by cost (`_support/tiers.py`, docs/testing.md, Tiers): how a test gets its tier, what the check holds it
to, and that the quick loop holds every registered method's math.

A method's home test file (`tests/methods/test_<module>.py`; the base's own settings, GRPO and TRL's entropy bonus:
`tests/trainer/test_base_parity.py`) holds its math in tests named for it: its worked example (`test_worked_example_*`,
the numbers of its docs page) and a loss step's loss and gradients against float64 or trl.GRPOTrainer (a name with
`loss`, then `gradient`). Collecting the suite as the quick loop selects it shows each registered name with such a
test there, and every worked example there."""

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from _support.tiers import TIER, by_model, cost_contradiction, mark_tier

from trl_entropy.methods import GRPO, METHODS


ROOT = Path(__file__).resolve().parents[2]
QUICK_LOOP = "pure or loss_step"  # the quick loop's selection (docs/testing.md)
WORKED_EXAMPLE = re.compile(r"^test_worked_example")
METHOD_MATH = re.compile(r"^test_(worked_example|\w*loss\w*gradient)")


def home(entry) -> str:
    """The test file of a registry entry's method."""
    if entry.key == GRPO.key:
        return "tests/trainer/test_base_parity.py"
    return f"tests/methods/test_{entry.config_class.__module__.rsplit('.', 1)[1]}.py"


class Collected:
    """The tests a pytest session keeps after its selection, as ``(file, test name)``."""

    def __init__(self):
        self.tests: set[tuple[str, str]] = set()

    def pytest_collection_finish(self, session):
        self.tests = {(item.path.relative_to(ROOT).as_posix(), item.originalname) for item in session.items}


def collect(selection: str, *paths: str) -> set[tuple[str, str]]:
    """The tests of ``paths`` that ``-m selection`` selects, collected as a run of the suite collects them."""
    collected = Collected()
    arguments = ["--collect-only", "-qq", "-p", "no:cacheprovider", "--rootdir", str(ROOT), "-m", selection]
    assert pytest.main([*arguments, *(str(ROOT / path) for path in paths)], plugins=[collected]) == pytest.ExitCode.OK
    return collected.tests


@pytest.fixture(scope="module")
def method_tests() -> dict[str, set[tuple[str, str]]]:
    """The methods' home files' tests, in the quick loop and out of it."""
    homes = sorted({home(entry) for entry in METHODS.values()})
    return {"quick": collect(QUICK_LOOP, *homes), "other": collect(f"not ({QUICK_LOOP})", *homes)}


def test_every_registered_method_has_its_math_in_the_quick_loop(method_tests):
    missing = [
        name
        for name, entry in METHODS.items()
        if not any(file == home(entry) and METHOD_MATH.match(test) for file, test in method_tests["quick"])
    ]
    assert missing == [], f"no worked example or loss-and-gradient test in the quick loop for {missing}"


def test_every_worked_example_is_in_the_quick_loop(method_tests):
    assert any(WORKED_EXAMPLE.match(test) for _, test in method_tests["quick"])  # the pattern finds them
    assert sorted(test for test in method_tests["other"] if WORKED_EXAMPLE.match(test[1])) == []


def test_the_check_holds_each_tier_to_its_cost():
    """(tier, trains, starts a process, builds a trainer) → whether the check fails the test."""
    cases = {
        ("training", True, False, True): False,
        ("training", False, True, False): False,  # a run of a script as a process
        ("training", False, False, True): True,  # a loss step hidden from the quick loop
        ("loss_step", False, False, True): False,
        ("loss_step", False, True, True): False,  # a compiler run as a process
        ("loss_step", True, False, True): True,  # a run slowing the quick loop
        ("pure", False, True, False): False,  # git, asked for the repository's files
        ("pure", True, False, False): True,
        ("pure", False, False, True): True,  # a loss step's cost under the pure tier
    }
    assert {case: cost_contradiction(*case) is not None for case in cases} == cases


def fake_item(file: str, name: str, fixtures=()):
    """What mark_tier reads of a collected test, and where it writes."""
    markers = []
    item = SimpleNamespace(path=Path(file), originalname=name, fixturenames=list(fixtures), stash=pytest.Stash())
    item.add_marker = lambda marker: markers.append(marker.name)
    item.markers = markers
    return item


def test_a_tier_comes_from_the_launches_then_the_test_then_the_file_then_the_folder():
    files = {"test_b.py": "pure", "test_c.py": by_model}
    tests = {"test_a.py": {"test_named": "loss_step"}}
    launches = {"test_a.py": {"test_launched"}, "test_d.py": "all"}
    unchecked = {"test_a.py": {"test_named"}}
    cases = [
        (("test_a.py", "test_launched"), ("launch", False)),
        (("test_d.py", "test_any"), ("launch", False)),
        (("test_a.py", "test_named"), ("loss_step", False)),
        (("test_a.py", "test_other"), ("training", True)),
        (("test_b.py", "test_any"), ("pure", True)),
        (("test_c.py", "test_any", ["tmp_path"]), ("pure", True)),
        (("test_c.py", "test_any", ["tmp_path", "toy_model_path"]), ("loss_step", True)),
    ]
    for arguments, (tier, checked) in cases:
        item = fake_item(*arguments)
        mark_tier(item, "training", files, launches, tests, unchecked)
        assert (item.markers, item.stash[TIER]) == ([tier], (tier, checked)), arguments
