"""The math reward used by examples/train.py on real datasets."""

import pytest

from trl_entropy.rewards import answers_match, extract_final_answer, math_answer_reward


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72"),
        ("so the area is \\boxed{\\frac{1}{2}} square units", "\\frac{1}{2}"),
        ("first \\boxed{3}, then corrected: \\boxed{4}", "4"),
        ("The total is 1,250 dollars.", "1,250"),
        ("no answer here", None),
    ],
)
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


@pytest.mark.parametrize(
    "predicted, reference, equal",
    [
        ("1,000", "1000", True),
        ("0.5", "1/2", True),
        ("72.", "72", True),
        ("$72", "72", True),
        ("71", "72", False),
        ("x + 1", "x+1", True),
        (None, "3", False),
        ("3", None, False),
    ],
)
def test_answers_match(predicted, reference, equal):
    assert answers_match(predicted, reference) is equal


def test_math_answer_reward_accepts_strings_and_conversations():
    completions = ["... so \\boxed{72}", [{"role": "assistant", "content": "It is 71"}], "#### 5"]
    assert math_answer_reward(completions, answer=["72", "72", "5"]) == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError):
        math_answer_reward(completions, answer=["72"])
