"""``trl-entropy demo`` (and examples/entropy_collapse_demo.py): the entropy-collapse demo of :mod:`trl_entropy.demo`.

Every field of :class:`trl_entropy.demo.arguments.DemoArguments` is a flag and a YAML key (``--config``). Without
matplotlib it stops (status 2) before the slow imports and any training, naming the extra that installs it.
"""

import os
import sys

from trl_entropy.report import missing_matplotlib


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the demo as the command line ``argv`` (default: the process's arguments) says; ``prog`` names the program
    in its messages (default: the script's file name)."""
    prog = prog or os.path.basename(sys.argv[0])
    problem = missing_matplotlib("the demo draws its curves")
    if problem:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    from trl import TrlParser

    from trl_entropy.core.trl.noise import hide_known_upstream_noise
    from trl_entropy.demo.arguments import DemoArguments
    from trl_entropy.demo.run import run_demo, write_outputs
    from trl_entropy.demo.worker import serve_jobs

    hide_known_upstream_noise()
    parser = TrlParser((DemoArguments,), prog=prog)
    try:
        (arguments,) = parser.parse_args_and_config(args=argv)
    except ValueError as error:  # DemoArguments' own checks, which name the field
        parser.error(str(error))
    if arguments.worker:
        serve_jobs()
    elif arguments.from_history:
        write_outputs(arguments.from_history)
    else:
        run_demo(arguments)
    return 0
