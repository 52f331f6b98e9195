"""The toy task: two-operand arithmetic prompts with verifiable answers, split into disjoint train and test parts,
and its binary reward."""

import random


TOY_PAD_TOKEN = "<pad>"
TOY_BOS_TOKEN = "<bos>"
TOY_EOS_TOKEN = "<eos>"
TOY_UNK_TOKEN = "<unk>"
_SPECIAL_TOKENS = (TOY_PAD_TOKEN, TOY_BOS_TOKEN, TOY_EOS_TOKEN, TOY_UNK_TOKEN)  # ids 0, 1, 2, 3

# Digits, the operators, "=" and space are what the task uses; lowercase letters are there so that prompts can carry a
# few words (e.g. "q: 3+4=") without hitting <unk>.
TOY_ALPHABET = "0123456789+-*= abcdefghijklmnopqrstuvwxyz:?"

# Problem space: "a<op>b=" with 0 <= a, b <= TOY_MAX_OPERAND. Chosen together with TOY_WARM_START_STEPS so that the
# warm-started policy sits mid-way: about 45-50% success on held-out prompts sampling at temperature 1 (seeds 0-3),
# about 75% greedy. Larger spaces (operands up to 29, or "+" and "-" up to 19) learn slower: about 20-30% after 300-400
# steps.
TOY_MAX_OPERAND = 19
TOY_OPERATORS = ("+",)
_OPERATOR_NAMES = {"+": "add", "-": "sub", "*": "mul"}  # the cache folder names an operator set by these
TOY_TEST_FRACTION = 0.2
_SPLIT_SEED = 20240601  # fixes the train/test partition independently of any user seed


def _apply(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"Unsupported operator {op!r}")


def _check_operators(operators) -> tuple[str, ...]:
    operators = tuple(operators)
    if not operators or len(set(operators)) != len(operators) or any(op not in _OPERATOR_NAMES for op in operators):
        raise ValueError(
            f"operators must be distinct operators among {sorted(_OPERATOR_NAMES)}, at least one, got {operators!r}"
        )
    return operators


def toy_problems(split: str = "train", operators: tuple[str, ...] = TOY_OPERATORS) -> list[tuple[str, str]]:
    """Return every ``(prompt, answer)`` pair of a split of the toy task, in a fixed order.

    The problem space of one operator (``f"{a}{op}{b}="`` with ``0 <= a, b <= TOY_MAX_OPERAND``: 400 problems) is
    shuffled once with a fixed seed and cut into a held-out ``"test"`` part (``TOY_TEST_FRACTION`` of it, 80
    problems) and a ``"train"`` part (320), so the two splits never share a prompt. With several ``operators``
    (default: only ``"+"``) the per-operator lists are concatenated in the given order, so an operator's split is
    the same whichever others come with it. ``split="all"`` returns the whole space.
    """
    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
    problems = []
    for op in _check_operators(operators):
        space = [
            (f"{a}{op}{b}=", str(_apply(a, op, b)))
            for a in range(TOY_MAX_OPERAND + 1)
            for b in range(TOY_MAX_OPERAND + 1)
        ]
        random.Random(_SPLIT_SEED).shuffle(space)
        n_test = int(round(len(space) * TOY_TEST_FRACTION))
        problems += {"test": space[:n_test], "train": space[n_test:], "all": space}[split]
    return problems


def _sample_problems(n: int, seed: int, split: str, operators: tuple[str, ...]) -> list[tuple[str, str]]:
    pool = toy_problems(split, operators)
    rng = random.Random(seed)
    if n <= len(pool):
        return rng.sample(pool, n)
    return [rng.choice(pool) for _ in range(n)]


def build_toy_dataset(n: int, seed: int = 0, split: str = "train", operators: tuple[str, ...] = TOY_OPERATORS):
    """Return a ``datasets.Dataset`` of ``n`` toy arithmetic problems with columns ``"prompt"`` and ``"answer"``.

    Prompts are plain (non-conversational) strings such as ``"7+12="``; answers are the decimal result as a string
    (``"19"``, ``"-3"`` for a subtraction). Problems are drawn from ``split`` (``"train"``, ``"test"`` or ``"all"``)
    of the ``operators``' problems (see :func:`toy_problems`) with ``seed``: without replacement when ``n`` fits in
    the split, with replacement otherwise.
    The ``"answer"`` column reaches :func:`toy_reward` as a keyword argument inside ``GRPOTrainer``.
    """
    from datasets import Dataset

    problems = _sample_problems(n, seed, split, operators)
    return Dataset.from_dict({"prompt": [p for p, _ in problems], "answer": [a for _, a in problems]})


def toy_reward(completions: list, answer: list[str], **kwargs) -> list[float]:
    """TRL reward function for the toy task: 1.0 when a completion is exactly the answer, else 0.0.

    ``completions`` are the decoded completions (strings; a conversational ``[{"content": ...}]`` list is accepted
    too) and ``answer`` the dataset column of the same length; other columns and trainer extras arrive in ``kwargs``
    and are ignored. Each completion is cut at the first ``TOY_EOS_TOKEN`` (TRL already drops it when decoding with
    ``skip_special_tokens=True``, but raw decodes keep it), stripped of surrounding whitespace and compared with the
    stripped answer. The reward is deliberately binary (no partial credit for a close number or a right prefix):
    it is the verifiable success signal the entropy-control methods are studied on.
    """
    rewards = []
    for completion, target in zip(completions, answer, strict=True):
        if isinstance(completion, list):  # conversational format: last message content
            completion = completion[-1]["content"] if completion else ""
        text = completion.split(TOY_EOS_TOKEN, 1)[0].strip()
        rewards.append(1.0 if text == str(target).strip() else 0.0)
    return rewards
