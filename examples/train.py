"""Train a policy with GRPO or one of the entropy-control methods.

Every field of the method's config, of TRL's `ModelConfig` (LoRA included) and of the script arguments below is a flag
and a YAML key (`--config file.yaml`).

The default run needs no network: the built-in toy policy (a tiny model warm-started on arithmetic) on the toy task,
on a CPU, with the toy recipe of `trl_entropy.methods.TOY_TRAINING_DEFAULTS` (400 steps, under a minute on an idle
core). `examples/configs/<method>.yaml` holds each method's toy-scale settings (those of the entropy-collapse demo):

    python examples/train.py --method aent
    python examples/train.py --config examples/configs/aent.yaml

A real model on a real math dataset with a verifiable reward (GSM8K's `question`/`answer` columns, or MATH-style
`problem`/`solution` columns whose final answer is the last `\\boxed{}`):

    accelerate launch --config_file examples/accelerate/multi_gpu.yaml examples/train.py --method repo_r \\
        --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name openai/gsm8k --dataset_config main \\
        --use_vllm --vllm_mode colocate --bf16

`--use_peft` trains a LoRA adapter with TRL's LoRA options (`--lora_r`, `--lora_alpha`, `--lora_target_modules`, ...).
"""

import sys
from dataclasses import dataclass, field

import yaml
from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config, get_quantization_config

from trl_entropy.methods import METHODS, TOY_NUM_PROMPTS, TOY_TRAINING_DEFAULTS, get_method, toy_training_set


INSTRUCTION = " Give the final answer as \\boxed{answer}."


@dataclass
class TrainScriptArguments(ScriptArguments):
    """Script arguments: TRL's dataset options plus the method and the toy task's size."""

    method: str = field(default="grpo", metadata={"help": "The method to train with.", "choices": sorted(METHODS)})
    toy_num_prompts: int = field(
        default=TOY_NUM_PROMPTS,
        metadata={
            "help": "Distinct toy problems to train on (at most 320), repeated as often as training needs; used when "
            "there is no --model_name_or_path. A small pool is what lets GRPO sharpen the toy policy within a few "
            "hundred steps."
        },
    )
    toy_policy_cache: str | None = field(
        default="outputs/toy_policy",
        metadata={"help": "Folder caching the warm-started toy policy between runs; None rebuilds it each time."},
    )


def option_value(argv: list[str], name: str) -> str | None:
    """The value of ``--name`` on the command line (``--name value`` or ``--name=value``), else None."""
    for index, argument in enumerate(argv):
        if argument == f"--{name}" and index + 1 < len(argv):
            return argv[index + 1]
        if argument.startswith(f"--{name}="):
            return argument.split("=", 1)[1]
    return None


def build_parser(argv: list[str]) -> TrlParser:
    """A parser for the method named on the command line or in the YAML config, with that method's defaults."""
    config_file = option_value(argv, "config")
    from_yaml = {}
    if config_file is not None:
        with open(config_file) as file:
            from_yaml = yaml.safe_load(file) or {}
    method_name = option_value(argv, "method") or from_yaml.get("method", "grpo")
    method = get_method(method_name)
    parser = TrlParser((TrainScriptArguments, method.config_class, ModelConfig))
    defaults = {"output_dir": f"outputs/{method_name}", **method.defaults}
    if option_value(argv, "model_name_or_path") is None and "model_name_or_path" not in from_yaml:
        defaults.update(TOY_TRAINING_DEFAULTS)
    parser.set_defaults(**defaults)
    return parser


def real_math_dataset(script_args):
    """The dataset's train split as conversational prompts with a reference ``answer`` column."""
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

    def to_prompt(row):
        return {
            "prompt": [{"role": "user", "content": row[question] + INSTRUCTION}],
            "answer": extract_final_answer(row[solution]),
        }

    return dataset.map(to_prompt, remove_columns=dataset.column_names)


def main(argv: list[str]) -> None:
    parser = build_parser(argv)
    script_args, training_args, model_args = parser.parse_args_and_config(args=argv)
    method = get_method(script_args.method)
    if script_args.method == "entreg" and training_args.entropy_coef == 0 and not training_args.use_adaptive_entropy:
        raise ValueError("--method entreg needs --entropy_coef > 0 or --use_adaptive_entropy")

    if model_args.model_name_or_path is None:
        import torch

        from trl_entropy.toy import build_toy_policy, toy_reward

        torch.set_num_threads(1)  # the toy model is tiny: more threads only add overhead
        model, tokenizer = build_toy_policy(seed=training_args.seed, cache_dir=script_args.toy_policy_cache)
        rows = max(training_args.max_steps, 1) * training_args.per_device_train_batch_size
        rows *= training_args.gradient_accumulation_steps
        train_dataset = toy_training_set(script_args.toy_num_prompts, rows, seed=training_args.seed)
        reward = toy_reward
    else:
        from transformers import AutoTokenizer

        from trl_entropy.rewards import math_answer_reward

        if script_args.dataset_name is None:
            raise ValueError("--model_name_or_path needs --dataset_name (a math dataset with verifiable answers)")
        model = model_args.model_name_or_path
        training_args.model_init_kwargs = {
            "revision": model_args.model_revision,
            "trust_remote_code": training_args.trust_remote_code,
            "attn_implementation": model_args.attn_implementation,
            "dtype": model_args.dtype,
            **(training_args.model_init_kwargs or {}),
        }
        tokenizer = AutoTokenizer.from_pretrained(model, revision=model_args.model_revision)
        train_dataset = real_math_dataset(script_args)
        reward = math_answer_reward

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


if __name__ == "__main__":
    main(sys.argv[1:])
