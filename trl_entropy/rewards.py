"""Verifiable rewards: for real math datasets (GSM8K-style numeric answers, MATH-style \\boxed{} answers), and for the
chat arithmetic task (:mod:`trl_entropy.toy.chat`), where an instruct model states its answer."""

import re
from fractions import Fraction


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")
_BOXED = re.compile(r"\\boxed\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")


def extract_final_answer(text: str) -> str | None:
    """The final answer of a solution or completion: the last ``\\boxed{...}``, else the text after GSM8K's ``####``,
    else the last number. None when there is none."""
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1].strip()
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def _as_number(answer: str) -> Fraction | None:
    cleaned = answer.replace(",", "").replace("$", "").strip().rstrip(".")
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(predicted: str | None, reference: str | None) -> bool:
    """Equal as numbers when both parse as numbers (``1,000`` = ``1000.0``, ``1/2`` = ``0.5``), else as stripped
    strings with spaces removed."""
    if predicted is None or reference is None:
        return False
    predicted_number, reference_number = _as_number(predicted), _as_number(reference)
    if predicted_number is not None and reference_number is not None:
        return predicted_number == reference_number
    return predicted.replace(" ", "") == reference.replace(" ", "")


def answer_rewards(completions: list, answer: list[str], extract) -> list[float]:
    """1.0 for each completion whose answer, as ``extract`` reads it from the text, equals its reference ``answer``,
    else 0.0. Completions may be strings or conversations (lists of messages), as TRL passes them."""
    rewards = []
    for completion, reference in zip(completions, answer, strict=True):
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        rewards.append(1.0 if answers_match(extract(text), reference) else 0.0)
    return rewards


def math_answer_reward(completions: list, answer: list[str], **kwargs) -> list[float]:
    """TRL reward function: 1.0 when the completion's final answer equals the reference ``answer`` column, else 0.0.

    Completions may be strings or conversations (lists of messages), as TRL passes them.
    """
    return answer_rewards(completions, answer, extract_final_answer)


def extract_stated_answer(text: str) -> str | None:
    """The answer a chat reply states: its first ``\\boxed{...}`` if it has one, else its first number. The task asks
    for a single number, so a reply that restates the operands before its result states the wrong answer. None when
    there is neither."""
    boxed = _BOXED.search(text)
    if boxed:
        return boxed.group(1).strip()
    number = _NUMBER.search(text)
    return number.group(0) if number else None


def stated_answer_reward(completions: list, answer: list[str], **kwargs) -> list[float]:
    """TRL reward function of the chat arithmetic task: 1.0 when the answer the completion states
    (:func:`extract_stated_answer`) equals the reference ``answer`` column, else 0.0.

    Completions may be strings or conversations (lists of messages), as TRL passes them.
    """
    return answer_rewards(completions, answer, extract_stated_answer)
