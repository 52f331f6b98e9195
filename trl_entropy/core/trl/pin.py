"""Fail fast, with a clear message, when the installed TRL is outside the range the trainers were built against.

The range is written once, here: ``TRL_REQUIREMENT`` is also setup.py's install requirement, which setup.py reads from
this file's text (it runs before any dependency is installed, so it cannot import the package)."""

from importlib.metadata import PackageNotFoundError, version

from packaging.requirements import Requirement
from packaging.version import Version


# TRL's GRPOTrainer internals (loss step, fused LM head, metric dict) are what the trainers build on. They change
# between minor releases, so the supported range is narrow. A plain string literal: setup.py parses it.
TRL_REQUIREMENT = "trl>=1.16.0,<1.17.0"

_BOUNDS = {specifier.operator: Version(specifier.version) for specifier in Requirement(TRL_REQUIREMENT).specifier}
TRL_MIN = _BOUNDS[">="]
TRL_MAX_EXCLUSIVE = _BOUNDS["<"]


def check_trl_version(installed: str | None = None) -> str:
    """Return the installed TRL version, or raise ImportError when it is missing or unsupported."""
    if installed is None:
        try:
            installed = version("trl")
        except PackageNotFoundError as error:
            raise ImportError(
                f"trl_entropy needs trl>={TRL_MIN},<{TRL_MAX_EXCLUSIVE}; trl is not installed."
            ) from error
    parsed = Version(installed)
    if not TRL_MIN <= Version(parsed.base_version) < TRL_MAX_EXCLUSIVE:
        raise ImportError(
            f"trl_entropy supports trl>={TRL_MIN},<{TRL_MAX_EXCLUSIVE} (it overrides GRPOTrainer internals that "
            f"change between releases), but trl=={installed} is installed. "
            f"Run: pip install 'trl>={TRL_MIN},<{TRL_MAX_EXCLUSIVE}'"
        )
    return installed
