"""The known upstream noise the examples hide: warnings and log lines from other packages that a user of
`examples/train.py` or the demo cannot act on. Only these are hidden; every other warning, this library's included,
still shows."""

import logging
import warnings


# Upstream deprecation notices a user of the examples cannot act on (TRL 1.16 still calls transformers' old
# gradient-checkpointing names). Only these are hidden; every other warning, this library's included, still shows.
KNOWN_UPSTREAM_WARNINGS = [(FutureWarning, r"`(is_)?gradient_checkpointing\w*` is deprecated")]
# DeepSpeed's import-time note on a machine without a GPU; the examples say themselves which precision they use.
KNOWN_UPSTREAM_LOG = ("DeepSpeed", "Setting accelerator to CPU")


def is_not_known_upstream_log(record: logging.LogRecord) -> bool:
    return not (record.name == KNOWN_UPSTREAM_LOG[0] and record.getMessage().startswith(KNOWN_UPSTREAM_LOG[1]))


def hide_known_upstream_noise() -> None:
    for category, message in KNOWN_UPSTREAM_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    logging.getLogger(KNOWN_UPSTREAM_LOG[0]).addFilter(is_not_known_upstream_log)  # added once however often called
