"""Train a policy with GRPO or one of the entropy-control methods: the same program as `trl-entropy train`
(trl_entropy/scripts/train.py), which an installed package runs without this clone.

Every field of the method's config, of TRL's `ModelConfig` (LoRA included) and of the script's arguments
(`trl_entropy.scripts.train_arguments.TrainScriptArguments`) is a flag and a YAML key (`--config file.yaml`); the
command line wins over the file. `--help` lists the method's own options first (`--method aent --help` for AEnt's).

The default run needs no network: the built-in toy policy (a tiny model warm-started on arithmetic) on the toy task,
on a CPU, with the toy recipe of `trl_entropy.toy.TOY_TRAINING_DEFAULTS` (400 steps; docs/demo.md gives the
times). `examples/configs/<method>.yaml` holds each method's toy-scale settings (those of the entropy-collapse demo):

    python examples/train.py --method aent
    python examples/train.py --config examples/configs/aent.yaml
    trl-entropy train --method aent            # the same, from anywhere

A real model on a real math dataset with a verifiable reward (GSM8K's `question`/`answer` columns, or MATH-style
`problem`/`solution` columns whose final answer is the last `\\boxed{}`):

    accelerate launch --config_file examples/accelerate/multi_gpu.yaml examples/train.py --method repo_r \\
        --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name openai/gsm8k --dataset_config main \\
        --use_vllm --vllm_mode colocate

`--use_peft` trains a LoRA adapter with TRL's LoRA options (`--lora_r`, `--lora_alpha`, `--lora_target_modules`, ...).
Each kind of run saves to its own folder unless `--output_dir` says otherwise: `outputs/<method>[-<config>]-<model>`,
with `-lora` for an adapter (`outputs/aent-toy`, `outputs/repo_r-Qwen2.5-0.5B-Instruct-lora`).

Precision: TRL trains in bf16 by default, which needs a GPU that has it. Without one (or with `--use_cpu`) and with
neither `--bf16` nor `--fp16` given, the script trains in fp32 and says so in one line.
"""

from trl_entropy.scripts.train import main


if __name__ == "__main__":
    main()
