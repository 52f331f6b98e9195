"""What a pushed model's card says about how it was trained: each trainer names its method and cites its paper next to
GRPO's (TRL writes the card from the trainer's ``_name``, ``_paper`` and ``_tag_names``)."""

from trl import GRPOTrainer


def method_paper(key: str, title: str, arxiv_id: str, year: int, authors: str | None = None) -> dict[str, str]:
    """TRL's ``_paper`` for a method: its title and arXiv id, and a citation block holding its BibTeX entry followed
    by GRPO's (DeepSeekMath, which the method builds on)."""
    author = f"    author        = {{{authors}}},\n" if authors else ""
    entry = (
        f"@misc{{{key},\n    title         = {{{{{title}}}}},\n{author}    year          = {year},\n"
        f"    eprint        = {{{arxiv_id}}},\n    archivePrefix = {{arXiv}},\n}}"
    )
    return {"title": title, "id": arxiv_id, "citation": f"{entry}\n\n{GRPOTrainer._paper['citation']}"}
