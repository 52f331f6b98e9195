"""Tier markers by cost. Every test gets one: `pure` (pure functions, configs, source checks), `loss_step` (one loss
step or scoring pass against float64 or trl.GRPOTrainer), `training` (short in-process training), `launch`
(subprocesses and multi-process launches). Each folder's conftest.py names its default tier, the files that differ,
the single tests that differ from their file and the launches one by one; `-m "pure or loss_step"` is the quick loop
(docs/testing.md)."""

import pytest


def mark_tier(item, default, files=None, launches=None, tests=None):
    """Give ``item`` its tier: ``launch`` if its file's entry in ``launches`` is ``"all"`` or names the test, else the
    tier its file's entry in ``tests`` (``{test name: tier}``) gives the test, else its file's tier in ``files``, else
    ``default``."""
    file = item.path.name
    named = (launches or {}).get(file, ())
    if named == "all" or item.originalname in named:
        tier = "launch"
    else:
        tier = (tests or {}).get(file, {}).get(item.originalname) or (files or {}).get(file, default)
    item.add_marker(getattr(pytest.mark, tier))
