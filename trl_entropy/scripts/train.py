"""``trl-entropy train`` (and examples/train.py): train a policy with GRPO or one of the entropy-control methods.

Without ``--model_name_or_path``: the built-in toy policy on the toy task, on the CPU, with the toy recipe. With one:
that model on a math dataset with verifiable answers (GSM8K's ``question``/``answer`` columns or MATH-style
``problem``/``solution``, from the Hub or a local folder), scored by :func:`trl_entropy.rewards.math_answer_reward`;
with ``--dataset_image_column`` too, a vision-language model on image questions of that form; with
``--chat_arithmetic_digits N`` instead of a dataset, an instruct model on the chat arithmetic task
(:mod:`trl_entropy.toy.chat`), scored by :func:`trl_entropy.rewards.stated_answer_reward`. The command line is
parsed by :mod:`trl_entropy.scripts.train_arguments`; ``--help`` lists the method's options first.
"""

import sys
from pathlib import Path

from trl import get_peft_config, get_quantization_config

from trl_entropy.core.trl.noise import hide_known_upstream_noise
from trl_entropy.methods import get_method
from trl_entropy.scripts.train_arguments import parse_arguments
from trl_entropy.toy import toy_training_set


INSTRUCTION = " Give the final answer as \\boxed{answer}."


def check_model_exists(parser, name_or_path: str, revision: str) -> None:
    """Fail early, naming the model, when ``name_or_path`` is neither a model folder nor a model on the Hub."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id
    from transformers.utils import cached_file

    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            parser.error(f"no model at {name_or_path}: the folder has no config.json")
        return
    try:
        validate_repo_id(name_or_path)
    except HFValidationError:  # only a path can look like this
        parser.error(f"no model at {name_or_path}: no such folder")
    try:
        cached_file(name_or_path, "config.json", revision=revision)
    except OSError as error:
        reason = str(error).split("\n")[0]
        parser.error(f"no model at {name_or_path}: no such folder, and not a model on the Hugging Face Hub ({reason})")


def real_math_dataset(script_args):
    """The dataset's train split as conversational prompts with a reference ``answer`` column, and the images of
    ``--dataset_image_column`` as TRL's ``image`` column."""
    from datasets import load_dataset

    from trl_entropy.rewards import extract_final_answer

    dataset = load_dataset(script_args.dataset_name, script_args.dataset_config, split=script_args.dataset_train_split)
    columns = set(dataset.column_names)
    if {"question", "answer"} <= columns:
        question, solution = "question", "answer"
    elif {"problem", "solution"} <= columns:
        question, solution = "problem", "solution"
    else:
        raise ValueError(
            f"{script_args.dataset_name} has columns {sorted(columns)}; the script reads 'question'/'answer' "
            "(GSM8K) or 'problem'/'solution' (MATH) columns"
        )

    image = script_args.dataset_image_column
    if image is not None and image not in columns:
        raise ValueError(
            f"{script_args.dataset_name} has no column {image!r} (--dataset_image_column); its columns: "
            f"{sorted(columns)}"
        )

    def to_prompt(row):
        return {
            "prompt": [{"role": "user", "content": row[question] + INSTRUCTION}],
            "answer": extract_final_answer(row[solution]),
        }

    dropped = [column for column in dataset.column_names if column != image]
    dataset = dataset.map(to_prompt, remove_columns=dropped)
    return dataset if image in (None, "image") else dataset.rename_column(image, "image")


def chat_arithmetic_training_set(script_args, seed: int):
    """The chat arithmetic task's training rows (conversational prompts, ``answer`` column) and its reward."""
    from trl_entropy.rewards import stated_answer_reward
    from trl_entropy.toy.chat import CHAT_ARITHMETIC_TRAIN_ROWS, build_chat_arithmetic_dataset

    rows = build_chat_arithmetic_dataset(
        CHAT_ARITHMETIC_TRAIN_ROWS, split="train", digits=script_args.chat_arithmetic_digits, seed=seed
    )
    return rows, stated_answer_reward


def without_image_tokens(generation_kwargs: dict | None, config) -> dict:
    """``generation_kwargs`` that also keep a vision-language model's image placeholder out of the completions (the
    forward would look for an image to put there)."""
    from trl_entropy.core.multimodal import image_token_id

    generation_kwargs = dict(generation_kwargs or {})
    suppressed = list(generation_kwargs.get("suppress_tokens") or [])
    token = image_token_id(config)
    if token is not None and token not in suppressed:
        generation_kwargs["suppress_tokens"] = [*suppressed, token]
    return generation_kwargs


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    """Train as the command line ``argv`` (default: the process's arguments) says; ``prog`` names the program in its
    messages (default: the script's file name)."""
    hide_known_upstream_noise()
    argv = sys.argv[1:] if argv is None else argv
    parser, script_args, training_args, model_args = parse_arguments(argv, prog)
    method = get_method(script_args.method)

    if model_args.model_name_or_path is None:
        if script_args.chat_arithmetic_digits is not None:
            parser.error(
                "--chat_arithmetic_digits needs --model_name_or_path (an instruct model with a chat template); "
                "without one the toy policy trains on the toy task"
            )
        import torch

        from trl_entropy.toy import build_toy_policy, toy_reward

        torch.set_num_threads(1)  # the toy model is tiny: more threads only add overhead
        model, tokenizer = build_toy_policy(seed=training_args.seed, cache_dir=script_args.toy_policy_cache)
        rows = max(training_args.max_steps, 1) * training_args.per_device_train_batch_size
        rows *= training_args.gradient_accumulation_steps
        train_dataset = toy_training_set(script_args.toy_num_prompts, rows, seed=training_args.seed)
        reward = toy_reward
    else:
        from transformers import AutoConfig, AutoProcessor, AutoTokenizer

        from trl_entropy.rewards import math_answer_reward

        check_model_exists(parser, model_args.model_name_or_path, model_args.model_revision)
        chat_arithmetic = script_args.chat_arithmetic_digits is not None
        if script_args.dataset_name is None and not chat_arithmetic:
            parser.error(
                "--model_name_or_path needs --dataset_name (a math dataset with verifiable answers), or "
                "--chat_arithmetic_digits N for the chat arithmetic task"
            )
        if script_args.dataset_name is not None and chat_arithmetic:
            parser.error("--dataset_name and --chat_arithmetic_digits each name the task to train on: give one")
        model = model_args.model_name_or_path
        training_args.model_init_kwargs = {
            "revision": model_args.model_revision,
            "trust_remote_code": training_args.trust_remote_code,
            "attn_implementation": model_args.attn_implementation,
            "dtype": model_args.dtype,
            **(training_args.model_init_kwargs or {}),
        }
        if script_args.dataset_image_column is None:
            tokenizer = AutoTokenizer.from_pretrained(model, revision=model_args.model_revision)
        else:  # a vision-language model: its processor, and no image placeholder sampled
            tokenizer = AutoProcessor.from_pretrained(model, revision=model_args.model_revision)
            config = AutoConfig.from_pretrained(model, revision=model_args.model_revision)
            training_args.generation_kwargs = without_image_tokens(training_args.generation_kwargs, config)
        if chat_arithmetic:
            train_dataset, reward = chat_arithmetic_training_set(script_args, training_args.seed)
        else:
            train_dataset, reward = real_math_dataset(script_args), math_answer_reward

    for notice in parser.notices:
        print(notice, file=sys.stderr)
    trainer = method.trainer_class(
        model=model,
        reward_funcs=reward,
        args=training_args,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        quantization_config=get_quantization_config(model_args),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    trainer.save_state()  # trainer_state.json beside the model: what `trl-entropy report` reads
    if trainer.accelerator.is_main_process:
        saved = "LoRA adapter" if model_args.use_peft else "model"
        print(f"{parser.prog}: saved the {saved} to {training_args.output_dir}", file=sys.stderr)
