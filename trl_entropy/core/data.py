"""Checks of the datasets a trainer is given, at construction: TRL itself finds a dataset it cannot read only at the
first generation, with a bare ``KeyError``."""

from datasets import Dataset, IterableDataset


def check_prompt_column(dataset, name: str) -> None:
    """Refuse a dataset without a ``prompt`` column. An iterable dataset whose columns are unknown (after a ``map``)
    shows them in its first example; anything but a ``datasets.Dataset`` or ``IterableDataset`` (None included) is
    left to TRL."""
    if not isinstance(dataset, (Dataset, IterableDataset)):
        return
    columns = dataset.column_names
    if columns is None:
        first = next(iter(dataset), None)
        if first is None:  # empty: nothing to check
            return
        columns = list(first)
    if "prompt" not in columns:
        raise ValueError(
            f"{name} has no 'prompt' column (its columns: {list(columns)}). The trainer reads each example's "
            "prompt from a column named 'prompt', as trl.GRPOTrainer does: a string (standard format) or a list of "
            "{'role': ..., 'content': ...} messages (conversational format). Rename the column that holds the "
            "prompts, e.g. dataset.rename_column('question', 'prompt'), or build it with dataset.map."
        )


def check_prompt_columns(train_dataset, eval_dataset) -> None:
    """:func:`check_prompt_column` on the train dataset and on the eval dataset, or each of a dict of them."""
    check_prompt_column(train_dataset, "train_dataset")
    evaluations = eval_dataset if isinstance(eval_dataset, dict) else {None: eval_dataset}
    for key, dataset in evaluations.items():
        check_prompt_column(dataset, "eval_dataset" if key is None else f"eval_dataset[{key!r}]")
