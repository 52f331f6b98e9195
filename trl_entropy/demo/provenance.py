"""What the demo's numbers came from: library versions, Python, the machine and its CPU's numeric path, the git
commit of the clone the library runs from; and the CPU time spent."""

import os
import platform
import subprocess
from pathlib import Path


def versions() -> dict:
    """What the numbers came from: library versions, Python, the machine, the git commit of the clone the library runs
    from (None for an installed package; taken when the demo starts)."""
    import torch
    import transformers
    import trl

    import trl_entropy
    from trl_entropy.core.trl.vllm import vllm_installed, vllm_version
    from trl_entropy.toy import cpu_path

    package = Path(trl_entropy.__file__).resolve().parent

    def git(*arguments: str) -> str | None:
        try:
            return subprocess.run(
                ["git", *arguments], cwd=package, capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    # Only a clone of this project: a package installed into some other repository's folder has no commit of its own.
    top = git("rev-parse", "--show-toplevel")
    in_clone = top is not None and Path(top).resolve() / "trl_entropy" == package
    changed = git("status", "--porcelain", "--", ":/trl_entropy", ":/examples") if in_clone else None
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "vllm": vllm_version() if vllm_installed() else None,
        "trl_entropy": trl_entropy.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
        "cpu_model": cpu_model(),
        # The vectorised kernels the runs computed with (ATEN_CPU_CAPABILITY): another path samples other tokens.
        "aten_cpu_capability": cpu_path(),
        "git_commit": git("rev-parse", "--short", "HEAD") if in_clone else None,
        # Uncommitted changes to the code the runs import, when there are any (the numbers may not match the commit).
        "git_uncommitted": changed.splitlines() if changed else [],
    }


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux; what the platform module reports elsewhere)."""
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_seconds() -> float:
    """CPU time used so far by this process and its finished worker processes (user + system)."""
    import resource

    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(item.ru_utime + item.ru_stime for item in usage)
