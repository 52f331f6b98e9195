"""What this library knows of other packages' messages: the warnings and log lines that TRL, transformers and DeepSpeed
emit while it runs, each matched by its words and by where it comes from (a transformers module, a named logger), so
that a message of this library (or of the user's own code) is never taken for one of theirs, whatever its words.

Importing this module (or ``trl_entropy``) changes no filter. :func:`hide_known_upstream_noise` hides the known noise
a user cannot act on; only the library's programs call it (``trl-entropy train`` and ``demo``, the demo's worker
processes, examples/train.py through them), as a program decides what its own process shows. A library user who wants
the same calls it once."""

import logging
import re
import warnings


# Deprecation notices TRL 1.16 provokes on every run: its GRPOConfig and trainer still use transformers 5's old
# gradient-checkpointing names (each warning is raised in the transformers module that defines the old name).
KNOWN_UPSTREAM_WARNINGS = [(FutureWarning, r"`(is_)?gradient_checkpointing\w*` is deprecated", r"transformers\.")]
# DeepSpeed's note on a machine without a GPU, logged when accelerate first imports deepspeed (the deepspeed extra);
# the examples say themselves which precision they use.
KNOWN_UPSTREAM_LOG = ("DeepSpeed", "Setting accelerator to CPU")
# transformers.Trainer's report, on resume, of the model's keys the checkpoint's weights file lacks (the checkpoint
# module drops it when it lists only tied weights: trl_entropy/core/checkpoint.py).
MISSING_KEYS_LOGGER = "transformers.trainer"
MISSING_KEYS_REPORT = re.compile(r"There were missing keys in the checkpoint model loaded: (\[.*\])\.")


def is_not_known_upstream_log(record: logging.LogRecord) -> bool:
    return not (record.name == KNOWN_UPSTREAM_LOG[0] and record.getMessage().startswith(KNOWN_UPSTREAM_LOG[1]))


def hide_known_upstream_noise() -> None:
    """Hide the known upstream noise in this process: a ``warnings`` filter per known warning and a filter on
    DeepSpeed's logger. For programs (the library's entry points call it), never called at import."""
    for category, message, module in KNOWN_UPSTREAM_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    logging.getLogger(KNOWN_UPSTREAM_LOG[0]).addFilter(is_not_known_upstream_log)  # added once however often called
