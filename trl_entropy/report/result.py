"""What :func:`trl_entropy.report.write_report` drew and wrote, which the drawing and the tables read."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .runlog import RunLog


if TYPE_CHECKING:  # the law (and the transformers import behind it) loads only once matplotlib is known to be there
    from trl_entropy.evaluation.entropy_law import EntropyLawFit


@dataclass
class Report:
    """What :func:`trl_entropy.report.write_report` drew and wrote: the panels' titles in order, one line per panel
    left out (and per law not fitted) and why, each run's law fit, one line per demo folder read as its runs
    (:func:`trl_entropy.report.expand_demo_folders`), and the two files."""

    runs: list[RunLog]
    panels: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    laws: dict[str, EntropyLawFit] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    png: Path | None = None
    markdown: Path | None = None
