"""Quiet by default: `import trl_entropy` hides the known upstream noise a run provokes (transformers' deprecation
notices, DeepSpeed's accelerator note) and nothing else, this library's warnings above all."""

import json
import logging
import subprocess
import sys
import warnings

import pytest

from trl_entropy.upstream_noise import KNOWN_UPSTREAM_LOG, hide_known_upstream_noise, is_not_known_upstream_log


# A user's script: a short run of the toy task, set up so that it provokes one warning of ours (a clip range that
# on-policy training never uses). It prints what it saw beneath what was printed: every record DeepSpeed logged
# (recorded by a filter placed ahead of the library's), and the FutureWarnings of the same run with every warning on.
SCRIPT = """
import json, logging, sys, warnings

logged = []
logging.getLogger("DeepSpeed").addFilter(lambda record: logged.append(record.getMessage()) or True)

from trl_entropy import EntropyGRPOConfig, EntropyGRPOTrainer
from trl_entropy.toy import build_toy_dataset, build_toy_model, build_toy_tokenizer, toy_reward


def run(output_dir):
    tokenizer = build_toy_tokenizer()
    args = EntropyGRPOConfig(
        output_dir=output_dir, per_device_train_batch_size=8, num_generations=4, max_completion_length=4, max_steps=1,
        epsilon_high=0.28, save_strategy="no", report_to=[], use_cpu=True, bf16=False, disable_tqdm=True,
    )
    EntropyGRPOTrainer(
        model=build_toy_model(tokenizer, seed=0), reward_funcs=toy_reward, args=args,
        train_dataset=build_toy_dataset(8, seed=0), processing_class=tokenizer,
    ).train()


run(sys.argv[1] + "/quiet")
with warnings.catch_warnings(record=True) as raised:
    warnings.simplefilter("always")
    run(sys.argv[1] + "/loud")
upstream = sorted({str(item.message) for item in raised if item.category is FutureWarning})
print("SEEN " + json.dumps({"deepspeed_imported": "deepspeed" in sys.modules, "logged": logged, "upstream": upstream}))
"""


def test_a_short_run_prints_no_upstream_noise_and_our_warning_still_shows(tmp_path):
    """In a fresh process, as a user runs it: the noise is raised (shown by the run with every warning on, and by
    DeepSpeed's log records) but never printed; the on-policy clip warning of ours is."""
    script = tmp_path / "short_run.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-4000:]
    printed, seen = done.stdout.rsplit("SEEN ", 1)
    printed += done.stderr
    seen = json.loads(seen)
    upstream = seen["upstream"]
    for name in ("gradient_checkpointing", "is_gradient_checkpointing", "gradient_checkpointing_enable"):
        assert any(message.startswith(f"`{name}` is deprecated") for message in upstream), (name, upstream)
    assert "is deprecated" not in printed and "FutureWarning" not in printed
    if seen["deepspeed_imported"]:  # the deepspeed extra: accelerate imports it while the trainer is built
        import torch

        if not torch.cuda.is_available():
            assert any(message.startswith(KNOWN_UPSTREAM_LOG[1]) for message in seen["logged"]), seen["logged"]
    assert KNOWN_UPSTREAM_LOG[1] not in printed
    assert "UserWarning: epsilon=0.2, epsilon_high=0.28 with fully on-policy updates" in printed


@pytest.mark.parametrize(
    ("category", "module", "hidden"),
    [
        (FutureWarning, "transformers.training_args", True),
        (FutureWarning, "transformers.modeling_utils", True),
        (FutureWarning, "trl_entropy.core.config", False),  # ours, even in upstream's words
        (FutureWarning, "__main__", False),  # the user's
        (UserWarning, "transformers.training_args", False),
    ],
)
def test_only_the_known_upstream_warnings_are_hidden(category, module, hidden):
    message = "`gradient_checkpointing` is deprecated and will be removed in v6."
    with warnings.catch_warnings(record=True) as shown:
        warnings.resetwarnings()  # the library's filter alone (the test configuration hides the same words)
        warnings.simplefilter("always")
        hide_known_upstream_noise()
        warnings.warn_explicit(message, category, "somewhere.py", 1, module=module)
    assert [str(item.message) for item in shown] == ([] if hidden else [message])


@pytest.mark.parametrize(
    ("logger", "message", "hidden"),
    [
        ("DeepSpeed", f"{KNOWN_UPSTREAM_LOG[1]}. If you have GPU or other accelerator, we were unable to ...", True),
        ("DeepSpeed", "Setting ds_accelerator to cuda (auto detect)", False),
        ("trl_entropy", KNOWN_UPSTREAM_LOG[1], False),
    ],
)
def test_only_the_known_upstream_log_line_is_hidden(logger, message, hidden):
    record = logging.LogRecord(logger, logging.WARNING, "somewhere.py", 1, message, None, None)
    assert is_not_known_upstream_log(record) is not hidden
    if logger == KNOWN_UPSTREAM_LOG[0]:
        assert is_not_known_upstream_log in logging.getLogger(logger).filters  # installed by the import
