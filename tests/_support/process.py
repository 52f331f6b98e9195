"""Six costs of a test process that say nothing about the code under test, removed once its imports are done (the
pytest session after collection; each rank script before its runs), and :func:`run_forked`, which spares a child
process the imports.

* accelerate looks up an installed package (``peft``, ``deepspeed``) by parsing its metadata file at every call of
  ``is_peft_model`` and ``extract_model_from_parallel``: about 4 ms each, several per trainer built and per scoring
  pass, which was a third of a toy trainer's construction. The installed packages do not change inside a process,
  so the answer is cached.
* A full garbage collection walks every object the imports of torch, transformers and TRL created (about 430,000,
  0.5 s), and ``transformers.Trainer.train`` asks for one at every start. Freezing the heap after the imports leaves
  those objects out of every later collection; what the tests create is collected as before. Whether the code under
  test frees what it should is not a question these collections answer (nothing here asserts on it).
* That collection (accelerate's ``free_memory``, which then empties the device's cache) still walks what the tests'
  fixtures hold: 60 to 80 ms per run, a tenth of an in-process training test. It is there to hand device memory
  back; without CUDA there is none, so it is left out, and Python's own generational collections run as usual.
* Every model card TRL writes with a checkpoint looks up five installed packages' versions (``importlib.metadata``,
  about 5 ms each); cached like accelerate's lookups.
* On a machine without CUDA, every ``torch.manual_seed`` (transformers' ``set_seed`` makes several per trainer built
  and per training run) queues a CUDA seed for a CUDA initialisation that cannot happen, and formats the caller's
  stack for its error message (several ms). Without CUDA the queued seed is dropped instead.
* Under DeepSpeed on the CPU (a launch with ``ACCELERATE_USE_DEEPSPEED=true``), DeepSpeed's communication backend
  compiles a shared-memory all-reduce kernel the first time it starts on a machine (and again for every new virtual
  environment): about 2 minutes on two cores, with both ranks waiting. Only DeepSpeed's inference all-reduce uses
  it; ZeRO-3 training communicates through ``torch.distributed`` (gloo here) either way. It is marked unavailable,
  so that DeepSpeed skips the build and keeps the gloo path.
"""

import atexit
import functools
import gc
import os
import sys
from pathlib import Path


def lighten() -> None:
    """Cache the installed-package lookups, drop CUDA seeds and accelerate's collections on a machine without CUDA,
    skip DeepSpeed's shared-memory kernel build and freeze the objects created so far (see the module)."""
    import accelerate.utils.imports
    import accelerate.utils.memory
    import torch.cuda.random

    model_cards = sys.modules.get("trl.trainer.utils")  # not imported here for a process that never uses TRL
    if model_cards is not None and not hasattr(model_cards.version, "cache_info"):
        model_cards.version = functools.cache(model_cards.version)
    if not torch.cuda.is_available():
        torch.cuda.random._lazy_call = _drop_cuda_call
        memory = accelerate.utils.memory
        if not hasattr(memory.clear_device_cache, "__wrapped__"):  # the first call in this process
            memory.clear_device_cache = _without_collection(memory.clear_device_cache)

    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

    lookup = accelerate.utils.imports._is_package_available
    if not hasattr(lookup, "cache_info"):  # the first call in this process
        accelerate.utils.imports._is_package_available = functools.cache(lookup)
        # Unfrozen at exit, so that the interpreter's teardown frees them (nanobind, in triton, reports leaks
        # otherwise).
        atexit.register(gc.unfreeze)
    gc.collect()
    gc.freeze()


def _drop_cuda_call(callable, **kwargs) -> None:
    """``torch.cuda._lazy_call`` where CUDA is unavailable: the call could never run."""


def _without_collection(clear_device_cache):
    """accelerate's ``clear_device_cache`` that never runs its full garbage collection (see the module)."""

    @functools.wraps(clear_device_cache)
    def clear(garbage_collection: bool = False) -> None:
        clear_device_cache(garbage_collection=False)

    return clear


def run_forked(function, *args) -> tuple[int, str]:
    """Run ``function(*args)`` in a child forked from this process: it starts with the imports paid (a fresh
    interpreter spends about 10 s of CPU on torch, transformers and TRL), and nothing it patches reaches this process.
    Returns the child's exit code (0 when the function returned, 1 when it raised, -N when signal N ended it) and what
    it printed, its traceback included. A child that hangs is ended (``_support/watchdog.py``)."""
    import faulthandler
    import multiprocessing
    import tempfile

    from _support.watchdog import join_watched

    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "output.txt"

        def child():
            sys.stdout = sys.stderr = open(log, "w", buffering=1)  # noqa: SIM115 (open until the child exits)
            os.dup2(sys.stdout.fileno(), 1)
            os.dup2(sys.stdout.fileno(), 2)
            faulthandler.enable(sys.stderr)  # a hang's stacks go to the log (pytest's handler writes elsewhere)
            function(*args)

        process = multiprocessing.get_context("fork").Process(target=child)
        process.start()
        join_watched([process], f"{function.__name__} in a forked child", [log])
        return process.exitcode, log.read_text()
