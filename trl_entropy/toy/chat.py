"""The arithmetic task in chat form, for instruct models: conversational prompts ("What is 37 + 58? ..."), disjoint
train and held-out splits, and a difficulty setting, the number of digits of the operands. The reward is
:func:`trl_entropy.rewards.stated_answer_reward`: the number the reply states first (or its ``\\boxed{}`` answer)."""

import random
import zlib

from .task import TOY_OPERATORS, _apply, _check_operators


CHAT_ARITHMETIC_INSTRUCTION = "Answer with a single number."
CHAT_ARITHMETIC_MAX_DIGITS = 3  # 810,000 problems per operator, enumerated in about a second
CHAT_ARITHMETIC_HELD_OUT = 5  # one problem in five (by a fixed hash) is held out
# Rows of `trl-entropy train --chat_arithmetic_digits N`'s training set; training repeats it as long as it needs.
CHAT_ARITHMETIC_TRAIN_ROWS = 4096


def operand_range(digits: int) -> range:
    """The operands with ``digits`` digits: 0-9 for one digit, 10-99 for two, 100-999 for three."""
    if not isinstance(digits, int) or not 1 <= digits <= CHAT_ARITHMETIC_MAX_DIGITS:
        raise ValueError(f"digits must be an integer from 1 to {CHAT_ARITHMETIC_MAX_DIGITS}, got {digits!r}")
    return range(0 if digits == 1 else 10 ** (digits - 1), 10**digits)


def chat_arithmetic_split(a: int, op: str, b: int) -> str:
    """``"test"`` (held out) or ``"train"``: a fixed hash of the problem decides, whatever the seed or the number of
    problems drawn. ``a + b`` and ``b + a`` (and ``a * b`` and ``b * a``) hash alike, so a problem's mirror never sits
    in the other split."""
    low, high = (min(a, b), max(a, b)) if op in "+*" else (a, b)
    return "test" if zlib.crc32(f"{low}{op}{high}".encode()) % CHAT_ARITHMETIC_HELD_OUT == 0 else "train"


def chat_arithmetic_problems(
    split: str = "train", digits: int = 1, operators: tuple[str, ...] = TOY_OPERATORS
) -> list[tuple[int, str, int]]:
    """Every problem ``(a, op, b)`` of a split (``"train"``, ``"test"`` or ``"all"``) with ``digits``-digit operands,
    operator by operator in the given order."""
    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
    operands = operand_range(digits)
    return [
        (a, op, b)
        for op in _check_operators(operators)
        for a in operands
        for b in operands
        if split == "all" or chat_arithmetic_split(a, op, b) == split
    ]


def chat_arithmetic_prompt(a: int, op: str, b: int) -> list[dict[str, str]]:
    """The conversational prompt of a problem: one user message."""
    return [{"role": "user", "content": f"What is {a} {op} {b}? {CHAT_ARITHMETIC_INSTRUCTION}"}]


def build_chat_arithmetic_dataset(
    n: int, split: str = "train", digits: int = 1, seed: int = 0, operators: tuple[str, ...] = TOY_OPERATORS
):
    """A ``datasets.Dataset`` of ``n`` chat arithmetic problems: ``"prompt"`` (a list of messages, TRL's
    conversational format) and ``"answer"`` (the result as a string, for the reward). Drawn from the split of
    :func:`chat_arithmetic_problems` with ``seed``: without replacement when ``n`` fits in it, with replacement
    otherwise."""
    from datasets import Dataset

    pool = chat_arithmetic_problems(split, digits, operators)
    rng = random.Random(seed)
    problems = rng.sample(pool, n) if n <= len(pool) else [rng.choice(pool) for _ in range(n)]
    return Dataset.from_dict(
        {
            "prompt": [chat_arithmetic_prompt(*problem) for problem in problems],
            "answer": [str(_apply(*problem)) for problem in problems],
        }
    )
