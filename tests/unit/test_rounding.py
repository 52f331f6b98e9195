"""The comparison helpers every two-process and layout test uses (``tests/_support/rounding.py``): the rule each bound
applies, the per-update growth of an integrated value's bound, and the measurement log."""

import json

import pytest
import torch
from _support.rounding import LOG_VARIABLE, Bound, check, check_per_update, summary


def test_check_applies_the_larger_of_the_relative_and_absolute_bounds():
    bound = Bound(rel=1e-3, abs=1e-6)
    check("q", [1.0 + 0.999e-3, 0.5e-6], [1.0, 0.0], bound)  # relative on the first, absolute on the second
    with pytest.raises(AssertionError, match=r"q\[0\]"):
        check("q", [1.0 + 1.001e-3], [1.0], bound)
    with pytest.raises(AssertionError, match=r"q\[1\]"):
        check("q", [1.0, 1.001e-6], [1.0, 0.0], bound)
    with pytest.raises(AssertionError, match="2 values against 1"):
        check("q", [1.0, 1.0], [1.0], bound)
    with pytest.raises(AssertionError):  # a non-finite value never passes
        check("q", [float("nan")], [1.0], Bound(rel=1.0, abs=1.0))


def test_check_flattens_tensors_tuples_and_lists_alike():
    check("q", [torch.tensor([[1.0, 2.0]]), (3.0,)], [1.0, 2.0, torch.tensor(3.0)], Bound(rel=0))
    with pytest.raises(AssertionError, match=r"q\[2\]"):
        check("q", [torch.tensor([[1.0, 2.0]]), (3.5,)], [1.0, 2.0, 3.0], Bound(rel=0.1))


def test_an_integrated_value_may_drift_by_one_bound_per_update():
    per_update = Bound(rel=0, abs=1e-6)
    # Each update adds rounding of up to one per-update bound: 0.9, 1.9, 2.9 of it after 1, 2, 3 updates.
    check_per_update("value", [0.9e-6, 1.9e-6, 2.9e-6], [0.0, 0.0, 0.0], per_update)
    with pytest.raises(AssertionError, match="after update 2"):
        check_per_update("value", [0.9e-6, 2.1e-6, 2.9e-6], [0.0, 0.0, 0.0], per_update)
    assert per_update.after(3) == Bound(rel=0, abs=3e-6)


def test_the_log_records_each_comparison_and_the_summary_folds_updates(tmp_path, monkeypatch):
    log = tmp_path / "rounding.jsonl"
    monkeypatch.setenv(LOG_VARIABLE, str(log))
    check("loss[a]", [2.0 + 2e-7], [2.0], Bound(rel=1e-6))
    check("loss[b]", [4.0 + 1e-6], [4.0], Bound(rel=1e-6))
    check_per_update("controller[a]", [1e-7, 6e-7], [0.0, 0.0], Bound(rel=0, abs=1e-6))
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [entry["quantity"] for entry in entries] == [
        "loss[a]",
        "loss[b]",
        "controller[a] after update 1",
        "controller[a] after update 2",
    ]
    assert entries[0]["abs"] == pytest.approx(2e-7) and entries[0]["rel"] == pytest.approx(1e-7)
    assert entries[0]["used"] == pytest.approx(0.1)  # 2e-7 of the 2e-6 this bound allows at 2.0
    assert entries[3]["used"] == pytest.approx(0.3)  # 6e-7 of the 2e-6 allowed after two updates
    table = summary(log.read_text().splitlines(), by_kind=True)
    path = entries[0]["path"]
    assert table["loss", path] == pytest.approx((1e-6, 2.5e-7, 0.25))
    # per update: 1e-7 after one, 6e-7 / 2 after two
    assert table["controller (per update)", path] == pytest.approx((3e-7, 0.0, 0.3))


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(LOG_VARIABLE, raising=False)
    monkeypatch.chdir(tmp_path)
    check("q", [1.0], [1.0], Bound(rel=0))
    assert list(tmp_path.iterdir()) == []
