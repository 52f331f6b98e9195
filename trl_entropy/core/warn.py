"""``warn_user``: a warning about the user's settings or run, shown at the user's line that led to it."""

import dataclasses
import os
import sys
import warnings

import accelerate
import transformers
import trl


# The code between the user's line and a warning: this package, the libraries it builds on (their config classes
# and trainers call ours), and the dataclass machinery (its generated ``__init__`` is compiled from "<string>").
PACKAGE = os.path.dirname(os.path.dirname(__file__))
LIBRARY_FOLDERS = (PACKAGE, *(os.path.dirname(module.__file__) for module in (trl, transformers, accelerate)))
LIBRARY_PREFIXES = tuple(folder + os.sep for folder in LIBRARY_FOLDERS)
LIBRARY_FILES = (dataclasses.__file__, "<string>")


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the first frame outside the library code above, so that the
    warning shows the user's line and filters by module (``-W``, ``filterwarnings``) match the user's code.

    A fixed ``stacklevel`` cannot: the depth differs between a method's own config, ``EntropyGRPOConfig`` (which
    composes configs), the trainer and TRL's argument parser. A program of this package run with ``python -m`` has no
    user frame: its warnings show the interpreter's frame that started it (``<frozen runpy>``).
    """
    frame, stacklevel = sys._getframe(), 1
    while frame.f_back is not None and (
        frame.f_code.co_filename.startswith(LIBRARY_PREFIXES) or frame.f_code.co_filename in LIBRARY_FILES
    ):
        frame, stacklevel = frame.f_back, stacklevel + 1
    warnings.warn(message, category, stacklevel=stacklevel)
