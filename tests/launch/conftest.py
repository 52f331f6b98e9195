"""Multi-process runs, the example scripts as processes, the GPU runbook's dry run and the real-model step benchmark's,
the two ranks' end with their owner, the watchdog. Tiers (`_support/tiers.py`): training unless named below."""

from _support.tiers import mark_tier


FILES = {}
LAUNCHES = {
    "test_distributed.py": "all",
    "test_vlm_distributed.py": "all",
    "test_gpu_runbook.py": "all",
    "test_step_bench.py": "all",
    "test_rank_pool_ends_with_its_owner.py": "all",
    "test_watchdog.py": "all",
    "test_examples.py": {
        "test_train_command_line_error_as_a_process",
        "test_train_real_model_on_a_local_math_dataset",
        "test_train_runs_every_method",
        "test_train_use_peft_trains_a_lora_adapter",
        "test_train_yaml_config_and_command_line_override",
        "test_train_vlm_on_a_local_image_question_dataset",
    },
}


def pytest_itemcollected(item):
    mark_tier(item, "training", FILES, LAUNCHES)
