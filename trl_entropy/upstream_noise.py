"""The known upstream noise that using this library provokes: warnings and log lines from other packages that a user
cannot act on. ``import trl_entropy`` hides them (the examples call :func:`hide_known_upstream_noise` too). Each is
matched by its message and by where it comes from, a transformers module or DeepSpeed's logger, so a warning of this
library (or of the user's own code) is never hidden, whatever its words."""

import logging
import warnings


# Deprecation notices TRL 1.16 provokes on every run: its GRPOConfig and trainer still use transformers 5's old
# gradient-checkpointing names (each warning is raised in the transformers module that defines the old name).
KNOWN_UPSTREAM_WARNINGS = [(FutureWarning, r"`(is_)?gradient_checkpointing\w*` is deprecated", r"transformers\.")]
# DeepSpeed's note on a machine without a GPU, logged when accelerate first imports deepspeed (the deepspeed extra);
# the examples say themselves which precision they use.
KNOWN_UPSTREAM_LOG = ("DeepSpeed", "Setting accelerator to CPU")


def is_not_known_upstream_log(record: logging.LogRecord) -> bool:
    return not (record.name == KNOWN_UPSTREAM_LOG[0] and record.getMessage().startswith(KNOWN_UPSTREAM_LOG[1]))


def hide_known_upstream_noise() -> None:
    for category, message, module in KNOWN_UPSTREAM_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    logging.getLogger(KNOWN_UPSTREAM_LOG[0]).addFilter(is_not_known_upstream_log)  # added once however often called
