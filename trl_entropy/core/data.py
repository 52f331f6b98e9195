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


def dataset_columns(dataset) -> list[str]:
    """The columns of a ``datasets`` dataset (an iterable one's from its first example when unknown); [] otherwise."""
    if not isinstance(dataset, (Dataset, IterableDataset)):
        return []
    columns = dataset.column_names
    if columns is None:
        first = next(iter(dataset), None)
        columns = [] if first is None else list(first)
    return list(columns)


def check_image_columns(train_dataset, eval_dataset, model, processing_class) -> None:
    """Refuse images for a text-only model: TRL reads an ``image`` or ``images`` column as the prompt's images, which
    only a vision-language model's processor can turn into model inputs."""
    from transformers import ProcessorMixin

    if isinstance(processing_class, ProcessorMixin):
        return
    evaluations = eval_dataset if isinstance(eval_dataset, dict) else {None: eval_dataset}
    named = {"train_dataset": train_dataset}
    named.update({"eval_dataset" if key is None else f"eval_dataset[{key!r}]": d for key, d in evaluations.items()})
    for name, dataset in named.items():
        images = [column for column in ("image", "images") if column in dataset_columns(dataset)]
        if images:
            raise ValueError(
                f"{name} has an {images[0]!r} column, but {type(model).__name__} is trained as a text-only model "
                f"(its processing_class is a {type(processing_class).__name__}, which cannot read images). Train a "
                "vision-language model with its processor (AutoModelForImageTextToText and AutoProcessor, e.g. "
                f"Qwen2.5-VL), or drop the column: dataset.remove_columns({images[0]!r})."
            )
