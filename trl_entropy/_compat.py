"""Fail fast, with a clear message, when the installed TRL is outside the range the trainers were built against."""

from importlib.metadata import PackageNotFoundError, version

from packaging.version import Version


TRL_MIN = Version("1.16.0")
TRL_MAX_EXCLUSIVE = Version("1.17.0")


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
