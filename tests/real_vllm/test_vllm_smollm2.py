"""Every registered method, and methods combined, trains SmolLM2-135M-Instruct with a real vLLM engine generating
(vLLM's CPU build, TRL's colocate mode), each run in a forked child (``_support/vllm_engine.py``), and vLLM samples
from the weights it trained.

The engine computes in fp32 like the trainer, and without ``torch.compile``. In fp32 the two score a sampled token
alike (0.00004 apart at most, measured over every method's steps), so the toy's bound on the sampling gap holds here
too, and a planted missing sync stands out by far more (5 to 12 after an update). By default vLLM's CPU build
downcasts the fp32 checkpoint to bf16, every synced weight rounded to bf16 too; there the gap grew with the updates
(up to 0.85 at the third step of one method, where a missing sync gives 4 to 10): ``test_vllm_sync.py`` trains
SmolLM2 on that default engine, compiled, against its own bound. Without ``torch.compile`` an engine starts in 5 s
instead of 40 s, which is what lets the whole registry fit in CI's vLLM lane; the recipe is small for the same reason
(one group of 4 completions of at most 4 tokens per step, 3 steps).
"""

import math

import pytest
from _support.vllm_engine import GAP_BOUND, in_child, read, smollm2_prompts, train_and_record

from trl_entropy.methods import METHODS


COMBINATION = "qae+kl_cov"
ENGINE = dict(dtype="float32", enforce_eager=True)
SMOLLM2_RECIPE = dict(
    learning_rate=1e-3,
    per_device_train_batch_size=4,  # one group: alternating_reward gives it both rewards, so every step updates
    max_completion_length=4,
    vllm_max_model_length=128,  # the chat template's prompt (about 30 tokens) and the completion
)


@pytest.mark.parametrize("method", [*sorted(METHODS), COMBINATION])
def test_every_method_trains_smollm2_with_vllm_within_the_gap_bound(method, smollm2_path, tmp_path):
    result = str(tmp_path / "run.json")
    prompts = smollm2_prompts(copies=1)
    in_child(
        train_and_record,
        method,
        smollm2_path,
        str(tmp_path),
        result,
        engine=ENGINE,
        train_dataset=prompts,
        **SMOLLM2_RECIPE,
    )
    run = read(result)
    assert run["steps"] == 3 and all(math.isfinite(loss) for loss in run["loss"]), run["loss"]
    generations = len(run["gap_max"])
    assert generations == math.ceil(3 / run["num_iterations"])
    assert run["syncs"] == sorted(set(run["syncs"])) and len(run["syncs"]) == generations  # one before each
    assert run["moved"] > 1e-3
    assert all(gap <= GAP_BOUND for gap in run["gap_max"]), run["gap_max"]
    for key, values in run["controllers"].items():
        assert len(values) == 3 and all(math.isfinite(v) for v in values), key
