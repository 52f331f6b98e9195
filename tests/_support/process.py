"""Three costs of a test process that say nothing about the code under test, removed once its imports are done (the
pytest session after collection; each rank script before its runs).

* accelerate looks up an installed package (``peft``, ``deepspeed``) by parsing its metadata file at every call of
  ``is_peft_model`` and ``extract_model_from_parallel``: about 4 ms each, several per trainer built and per scoring
  pass, which was a third of a toy trainer's construction. The installed packages do not change inside a process,
  so the answer is cached.
* A full garbage collection walks every object the imports of torch, transformers and TRL created (about 430,000,
  0.5 s), and ``transformers.Trainer.train`` asks for one at every start. Freezing the heap after the imports leaves
  those objects out of every later collection; what the tests create is collected as before. Whether the code under
  test frees what it should is not a question these collections answer (nothing here asserts on it).
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


def lighten() -> None:
    """Cache accelerate's installed-package lookups, skip DeepSpeed's shared-memory kernel build and freeze the
    objects created so far (see the module)."""
    import accelerate.utils.imports

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
