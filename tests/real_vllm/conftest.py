"""A real vLLM engine (vLLM's CPU build, colocate mode) generating for the trainers. These tests need vLLM installed:
CI's vLLM lane (`.ci/run`) builds an environment with it as docs/distributed.md says, and runs this folder there.
Elsewhere they are skipped, with that reason. Tiers (`_support/tiers.py`): launch (each run forks a child that builds
its engine) unless named below."""

import importlib.util

import pytest
from _support.tiers import mark_tier
from _support.vllm_engine import VLLM_MISSING, save_vllm_toy_policy


FILES = {"test_vllm_arguments.py": "pure"}


def pytest_itemcollected(item):
    mark_tier(item, "launch", FILES)
    item.add_marker(pytest.mark.vllm)
    if importlib.util.find_spec("vllm") is None:
        item.add_marker(pytest.mark.skip(reason=VLLM_MISSING))


@pytest.fixture(scope="session")
def vllm_toy_path(tmp_path_factory):
    """The toy policy in a shape vLLM's CPU attention takes, saved once per test process."""
    return save_vllm_toy_policy(str(tmp_path_factory.mktemp("vllm_toy")))
