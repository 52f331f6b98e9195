"""What a pushed model's card says about how it was trained: each trainer names its method and cites its paper next to
GRPO's (``core/trl/bridge.py`` writes them where TRL's card reads them)."""

from dataclasses import dataclass

from .trl.bridge import grpo_citation, model_card_tags, set_model_card


__all__ = ["Paper", "method_paper", "model_card_tags", "sign_combined_model_card"]


@dataclass(frozen=True)
class Paper:
    """A method's paper: its BibTeX key, title, arXiv id, year, (where known) authors, and a ``note`` that
    docs/references.md prints after the arXiv id (its venue, the titles of other versions)."""

    bibtex_key: str
    title: str
    arxiv_id: str
    year: int
    authors: str | None = None
    note: str | None = None

    @property
    def bibtex(self) -> str:
        author = f"    author        = {{{self.authors}}},\n" if self.authors else ""
        return (
            f"@misc{{{self.bibtex_key},\n    title         = {{{{{self.title}}}}},\n{author}"
            f"    year          = {self.year},\n    eprint        = {{{self.arxiv_id}}},\n"
            "    archivePrefix = {arXiv},\n}"
        )


def method_paper(paper: Paper) -> dict[str, str]:
    """TRL's ``_paper`` for a method: its title and arXiv id, and a citation block holding its BibTeX entry followed
    by GRPO's (DeepSeekMath, which the method builds on)."""
    return {
        "title": paper.title,
        "id": paper.arxiv_id,
        "citation": f"{paper.bibtex}\n\n{grpo_citation()}",
    }


def sign_combined_model_card(trainer, methods: list[tuple[str, Paper, str]]) -> None:
    """Make ``trainer``'s model card (a trainer's, or its class's) say "trained with" every method of ``methods``
    (``(name, paper, tag)``), each with its arXiv id, cite every paper and GRPO's, and carry every tag."""
    name = " + ".join(f"{method} (arXiv:{paper.arxiv_id})" for method, paper, _ in methods)
    citation = "\n\n".join([*(paper.bibtex for _, paper, _ in methods), grpo_citation()])
    set_model_card(trainer, name, {"citation": citation}, [tag for _, _, tag in methods])
