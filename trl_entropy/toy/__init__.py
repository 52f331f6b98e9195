"""An offline toy task: tiny tokenizer, tiny causal LM, verifiable arithmetic, binary reward.

Everything here is built from code, never downloaded, so tests and examples run on any machine (no Hugging Face Hub
access, CPU only) in seconds:

* :func:`build_toy_tokenizer`: a character-level ``PreTrainedTokenizerFast`` over a small alphabet.
* :func:`build_toy_model`: a randomly initialised two-layer Llama-architecture causal LM sized to that tokenizer.
* :func:`build_toy_dataset`: two-operand arithmetic prompts such as ``"7+12="`` with their answers (``"19"``), in
  disjoint ``"train"`` and ``"test"`` splits; addition by default, subtraction or multiplication on request
  (``operators=("-",)``), which gives a second task on the same tokenizer.
* :func:`toy_reward`: a TRL reward function (binary: 1.0 for the exact answer, else 0.0).
* :func:`warm_start`: a short supervised fit so that reinforcement learning starts from a policy that succeeds *some*
  of the time when sampling at temperature 1 (no success, or constant success, would give GRPO no advantage signal).
* :func:`build_toy_policy`: the model and tokenizer, built and warm-started, optionally cached on disk.
* :func:`toy_success_rate`: the sampled success rate on held-out prompts.
* ``TOY_TRAINING_DEFAULTS`` and :func:`toy_training_set`: the training recipe of `examples/train.py` without a model
  and of the entropy-collapse demo.
* :func:`build_chat_arithmetic_dataset`: the same arithmetic in chat form for a real instruct model
  (``"What is 37 + 58? Answer with a single number."``), operands of 1 to 3 digits, disjoint train and held-out
  splits (:func:`chat_arithmetic_problems`), scored by :func:`trl_entropy.rewards.stated_answer_reward`.

Quick start::

    from trl import GRPOConfig, GRPOTrainer
    from trl_entropy.toy import build_toy_dataset, build_toy_policy, toy_reward

    model, tokenizer = build_toy_policy(cache_dir="/tmp/toy_policy")
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=toy_reward,
        args=GRPOConfig(output_dir="/tmp/out", use_cpu=True, max_completion_length=8, num_generations=4, ...),
        train_dataset=build_toy_dataset(256),
    )
"""

from .chat import (
    CHAT_ARITHMETIC_INSTRUCTION,
    CHAT_ARITHMETIC_MAX_DIGITS,
    build_chat_arithmetic_dataset,
    chat_arithmetic_problems,
    chat_arithmetic_prompt,
    chat_arithmetic_split,
)
from .model import TOY_MODEL_MAX_LENGTH, build_toy_model, build_toy_tokenizer
from .recipe import TOY_NUM_PROMPTS, TOY_TRAINING_DEFAULTS, toy_training_set
from .success import toy_success_rate
from .task import (
    TOY_ALPHABET,
    TOY_BOS_TOKEN,
    TOY_EOS_TOKEN,
    TOY_MAX_OPERAND,
    TOY_OPERATORS,
    TOY_PAD_TOKEN,
    TOY_UNK_TOKEN,
    build_toy_dataset,
    toy_problems,
    toy_reward,
)
from .warm_start import TOY_WARM_START_STEPS, build_toy_policy, cpu_path, torch_single_thread, warm_start


__all__ = [
    "CHAT_ARITHMETIC_INSTRUCTION",
    "CHAT_ARITHMETIC_MAX_DIGITS",
    "TOY_ALPHABET",
    "TOY_BOS_TOKEN",
    "TOY_EOS_TOKEN",
    "TOY_MAX_OPERAND",
    "TOY_MODEL_MAX_LENGTH",
    "TOY_NUM_PROMPTS",
    "TOY_OPERATORS",
    "TOY_PAD_TOKEN",
    "TOY_TRAINING_DEFAULTS",
    "TOY_UNK_TOKEN",
    "TOY_WARM_START_STEPS",
    "build_chat_arithmetic_dataset",
    "build_toy_dataset",
    "build_toy_model",
    "build_toy_policy",
    "build_toy_tokenizer",
    "chat_arithmetic_problems",
    "chat_arithmetic_prompt",
    "chat_arithmetic_split",
    "cpu_path",
    "toy_problems",
    "toy_reward",
    "toy_success_rate",
    "toy_training_set",
    "torch_single_thread",
    "warm_start",
]
