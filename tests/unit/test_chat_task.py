"""The chat arithmetic task (trl_entropy/toy/chat.py) and its reward, checked against what the tests compute
themselves: the answers a reply states, the problems and their results read back from the prompts, the splits'
disjointness, the operands' digits; and how `trl-entropy train --chat_arithmetic_digits` builds its training set."""

import itertools
import operator
import re

import pytest
from trl.data_utils import is_conversational

import trl_entropy.scripts.train as train_script
import trl_entropy.scripts.train_arguments as train_arguments
from trl_entropy.rewards import extract_stated_answer, stated_answer_reward
from trl_entropy.toy import (
    CHAT_ARITHMETIC_INSTRUCTION,
    build_chat_arithmetic_dataset,
    chat_arithmetic_problems,
    chat_arithmetic_split,
)


PROMPT = re.compile(r"What is (\d+) ([-+*]) (\d+)\? " + re.escape(CHAT_ARITHMETIC_INSTRUCTION))
RESULT = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def problem_of(row) -> tuple[int, str, int]:
    (message,) = row["prompt"]
    assert message["role"] == "user"
    a, op, b = PROMPT.fullmatch(message["content"]).groups()
    return int(a), op, int(b)


# ---------------------------------------------------------------------------------------------------------------------
# The reward: the answer a reply states
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reply", "stated"),
    [
        ("7", "7"),
        ("The answer is 7.", "7"),
        ("3 + 4 = 7", "3"),  # the task asks for one number: a restated operand comes first
        ("3 + 4 = \\boxed{7}", "7"),  # a boxed answer wins over the numbers before it
        ("\\boxed{8}, or maybe \\boxed{7}", "8"),
        ("It is -31.", "-31"),
        ("That makes 1,024 apples", "1,024"),
        ("I cannot tell.", None),
    ],
)
def test_extract_stated_answer(reply, stated):
    assert extract_stated_answer(reply) == stated


def test_stated_answer_reward_on_hand_written_replies():
    replies = [
        "7",
        "The answer is 7.",
        "3 + 4 = 7",
        "3 + 4 = \\boxed{7}",
        [{"role": "assistant", "content": "-31"}],  # conversational, as TRL passes a chat model's completion
        "27 - 58 = -31",
        "7.0",
        "I cannot tell.",
        "1,000",
    ]
    answers = ["7", "7", "7", "7", "-31", "-31", "7", "7", "1000"]
    assert stated_answer_reward(replies, answer=answers) == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    with pytest.raises(ValueError):
        stated_answer_reward(replies, answer=answers[:1])  # one reference per completion


# ---------------------------------------------------------------------------------------------------------------------
# The task: prompts, answers, splits, difficulty
# ---------------------------------------------------------------------------------------------------------------------
def test_rows_are_conversational_prompts_with_their_results():
    rows = build_chat_arithmetic_dataset(64, digits=2, operators=("+", "-", "*"))
    assert rows.column_names == ["prompt", "answer"]
    for row in rows:
        assert is_conversational(row)  # TRL's own test: the prompt goes through the chat template
        a, op, b = problem_of(row)
        assert row["answer"] == str(RESULT[op](a, b))


@pytest.mark.parametrize("operators", [("+",), ("-",), ("*",), ("+", "-")])
def test_the_splits_partition_the_problems_and_keep_mirrors_together(operators):
    everything = {(a, op, b) for op in operators for a, b in itertools.product(range(10), repeat=2)}
    train = set(chat_arithmetic_problems("train", 1, operators))
    test = set(chat_arithmetic_problems("test", 1, operators))
    assert train | test == everything and not train & test
    assert 0.1 < len(test) / len(everything) < 0.3
    for a, op, b in test:
        if op in "+*":
            assert (b, op, a) in test  # 4 + 3 is never trained on when 3 + 4 is held out


def test_datasets_drawn_from_the_two_splits_share_no_problem():
    train = {problem_of(row) for row in build_chat_arithmetic_dataset(2000, split="train", digits=2, seed=1)}
    test = {problem_of(row) for row in build_chat_arithmetic_dataset(500, split="test", digits=2, seed=2)}
    assert len(test) == 500  # without replacement: 500 fits in the held-out split
    assert not train & test
    assert not {(b, op, a) for a, op, b in test if op == "+"} & train


@pytest.mark.parametrize(("digits", "smallest", "largest"), [(1, 0, 9), (2, 10, 99), (3, 100, 999)])
def test_digits_set_the_operands(digits, smallest, largest):
    operands = [x for row in build_chat_arithmetic_dataset(300, digits=digits, seed=3) for x in problem_of(row)[::2]]
    assert min(operands) >= smallest and max(operands) <= largest
    assert len({len(str(x)) for x in operands}) == 1


def test_bad_settings_name_what_to_change():
    with pytest.raises(ValueError, match="digits must be an integer from 1 to 3, got 4"):
        build_chat_arithmetic_dataset(4, digits=4)
    with pytest.raises(ValueError, match="split must be 'train', 'test' or 'all', got 'eval'"):
        build_chat_arithmetic_dataset(4, split="eval")
    with pytest.raises(ValueError, match="operators must be distinct operators"):
        build_chat_arithmetic_dataset(4, operators=("/",))


def test_the_split_of_a_problem_does_not_depend_on_the_draw():
    assert chat_arithmetic_split(3, "+", 4) == chat_arithmetic_split(4, "+", 3)
    rows = build_chat_arithmetic_dataset(100, split="test", digits=1, seed=5)  # more than the 19 held-out sums
    assert {chat_arithmetic_split(*problem_of(row)) for row in rows} == {"test"}


# ---------------------------------------------------------------------------------------------------------------------
# `trl-entropy train --chat_arithmetic_digits N`
# ---------------------------------------------------------------------------------------------------------------------
def test_train_builds_the_chat_task_from_its_training_split():
    _, script_args, training_args, _ = train_arguments.parse_arguments(
        ["--model_name_or_path", "some/model", "--chat_arithmetic_digits", "2", "--seed", "3"]
    )
    rows, reward = train_script.chat_arithmetic_training_set(script_args, training_args.seed)
    assert reward is stated_answer_reward
    problems = [problem_of(row) for row in rows]
    assert {chat_arithmetic_split(*problem) for problem in problems} == {"train"}
    assert all(10 <= a <= 99 and 10 <= b <= 99 and op == "+" for a, op, b in problems)
