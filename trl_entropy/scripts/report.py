"""``trl-entropy report``: the report's command line, which lives with the report (:mod:`trl_entropy.report.command`)
so that ``python -m trl_entropy.report`` runs it too."""

from trl_entropy.report.command import build_parser, main


__all__ = ["build_parser", "main"]
