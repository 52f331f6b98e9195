"""`benchmarks/select_sweep.py`'s sizes: the defaults first, then the grid's product without repeating them; fields
that are not ``SelectionSizes``' refused by name. (Its run is the GPU runbook's dry-run stage.)"""

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from trl_entropy.kernels._triton_ops import SelectionSizes


SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "select_sweep.py"


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("select_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_grid_is_the_defaults_then_the_product(sweep):
    defaults = SelectionSizes()
    sizes = sweep.sizes_grid(defaults, json.dumps({"probes": [16, defaults.probes], "num_warps": [4, 8]}))
    assert sizes[0] == defaults
    assert sizes[1:] == [
        dataclasses.replace(defaults, probes=16, num_warps=4),
        dataclasses.replace(defaults, probes=16, num_warps=8),
        dataclasses.replace(defaults, num_warps=8),
    ]
    assert [sweep.label(s, defaults) for s in sizes] == [
        "defaults",
        "probes=16",
        "probes=16, num_warps=8",
        "num_warps=8",
    ]


@pytest.mark.parametrize(
    "grid, message",
    [
        ('{"probez": [8]}', "['probez'], not fields of SelectionSizes"),
        ('{"probes": []}', "non-empty list"),
        ('{"probes": 8}', "non-empty list"),
        ("probes=8", "is not JSON"),
    ],
)
def test_bad_grids_are_refused(sweep, grid, message):
    with pytest.raises(SystemExit, match=message.replace("[", r"\[").replace("]", r"\]")):
        sweep.sizes_grid(SelectionSizes(), grid)
