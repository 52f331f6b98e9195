"""A short toy training run of one or more trainers, written for ``accelerate launch`` and for a plain process.

    accelerate launch --cpu --num_processes 2 tests/distributed_run.py --model PATH --out DIR --methods aent,adapo
    python tests/distributed_run.py --model PATH --out DIR --methods aent,adapo --per-device-batch-size 8
    python tests/distributed_run.py --model DIR/toy --out DIR --methods all --vllm colocate --steps 5   # GPU + vLLM

Completions come from :func:`deterministic_rollout` (TRL's ``rollout_func`` hook), a fixed function of the prompt and
of its copy index inside the group, so a run on two processes and a run on one process with the same global batch see
the same completions and rewards; everything downstream (scoring, advantages, loss, gradient all-reduce, controller
statistics and updates) is the trainers' own. Every rank writes ``<method>_rank<k>.json``: per optimizer step the
controller value it holds, and the logged loss and entropy, plus a checksum and the first values of its final weights.

The tests import :func:`deterministic_rollout`, :func:`make_trainer` and :class:`ControllerRecorder` from here too.
"""

import argparse
import json
import os
import sys
import zlib
from collections import Counter


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402


ADAPTIVE_METHODS = ("aent", "repo_r", "repo_d", "adapo")
# Completion length (characters before <eos>) of the k-th copy of a prompt: unequal inside a group, equal across
# groups, so every group, hence every rank's half of the batch, holds the same number of completion tokens.
COPY_LENGTHS = (2, 5, 3, 4)


def rollout_text(prompt: str, copy: int, lengths: tuple[int, ...] = COPY_LENGTHS) -> str:
    """The completion of copy ``copy`` of a toy prompt ``"a+b="``: right or off by one, padded to a fixed width."""
    a, b = (int(x) for x in prompt.rstrip("=").split("+"))
    correct = (zlib.crc32(f"{prompt}|{copy}".encode()) % 3) != 0  # deterministic, unlike hash()
    answer = str(a + b if correct else a + b + 1)
    return answer.rjust(lengths[copy % len(lengths)])  # toy_reward strips the spaces


def make_rollout(lengths: tuple[int, ...] = COPY_LENGTHS, eos: bool = True):
    """A TRL ``rollout_func`` whose completions depend only on the prompt and its copy index: no sampling.

    ``lengths[k]`` is the width of copy ``k``'s answer; ``eos=False`` leaves the ``<eos>`` out (truncated completions).
    """

    def rollout(prompts: list, trainer) -> dict:
        tokenizer = trainer.processing_class
        seen = Counter()
        prompt_ids, completion_ids = [], []
        for prompt in prompts:
            text = rollout_text(prompt, seen[prompt], lengths)
            seen[prompt] += 1
            prompt_ids.append(tokenizer(prompt, add_special_tokens=False)["input_ids"])
            tail = [tokenizer.eos_token_id] if eos else []
            completion_ids.append(tokenizer(text, add_special_tokens=False)["input_ids"] + tail)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    return rollout


deterministic_rollout = make_rollout()


def controller_value(trainer) -> float | None:
    """The single controller's value (AEnt λ, REPO β, ADAPO ε_high), or None for a method without a controller."""
    if not trainer.controllers:
        return None
    (controller,) = trainer.controllers.values()
    return float(controller.value)


class ControllerRecorder(TrainerCallback):
    """Records, after every optimizer step, the controller value this rank holds."""

    def __init__(self):
        self.trainer = None
        self.values: list[float | None] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.values.append(controller_value(self.trainer))


def method_options(method: str) -> dict:
    """Config options that make the controller move visibly within a few toy steps."""
    from trl_entropy.methods import get_method

    options = dict(get_method(method).defaults)
    if method == "clip_cov":
        # Every valid token a candidate, a tenth of them detached: the random draw happens on every micro-batch.
        options.update(clip_cov_ratio=0.1, clip_cov_lb=-10.0, clip_cov_ub=10.0)
    if method == "kl_cov":
        options.update(num_iterations=2)  # two updates per rollout: ℓ^old ≠ ℓ on the second, so the penalty acts
    if method == "aent":
        # A band above the toy's entropy and a large α: λ rises by a different amount every step.
        options.update(aent_entropy_low=3.0, aent_entropy_high=4.0, aent_coef_lr=1e-3, aent_coef_max=1.0)
    return options


def make_trainer(
    method: str,
    model,
    output_dir: str,
    rollout=deterministic_rollout,
    dataset_size=16,
    trainer_kwargs=None,
    **overrides,
):
    """A trainer of the registered ``method`` on the toy task (fp32, CPU, no reporting).

    ``overrides`` are config fields; ``trainer_kwargs`` go to the trainer (``peft_config``, ...). ``rollout=None``
    samples completions from the policy as usual.
    """
    from trl_entropy.methods import get_method
    from trl_entropy.toy import build_toy_dataset, toy_reward

    spec = get_method(method)
    options = dict(
        output_dir=output_dir,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        learning_rate=1e-3,
        max_steps=3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=0,
    )
    options.update(method_options(method))
    options.update(overrides)
    args = spec.config_class(**options)
    return spec.trainer_class(
        model=model,
        reward_funcs=toy_reward,
        args=args,
        train_dataset=build_toy_dataset(dataset_size, seed=0),
        rollout_func=rollout,
        **(trainer_kwargs or {}),
    )


def logged(trainer, key: str) -> list[float]:
    return [entry[key] for entry in trainer.state.log_history if key in entry and "train_runtime" not in entry]


VLLM_OPTIONS = dict(
    rollout=None,  # vLLM samples
    use_cpu=False,
    bf16=True,
    use_vllm=True,
    vllm_gpu_memory_utilization=0.25,
    vllm_max_model_length=64,
)
VLLM_METRICS = ("sampling/importance_sampling_ratio/mean", "sampling/sampling_logp_difference/mean")


def save_vllm_toy_policy(path: str) -> None:
    """The toy policy for the vLLM smoke test: head size 64 (vLLM's attention kernels want a common head size), warm
    started on the toy task, saved in bfloat16."""
    from trl_entropy.toy import build_toy_model, build_toy_tokenizer, warm_start

    tokenizer = build_toy_tokenizer()
    model = build_toy_model(
        tokenizer, hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=2
    )
    warm_start(model, tokenizer)
    model.to(torch.bfloat16).save_pretrained(path)
    tokenizer.save_pretrained(path)


def run(method: str, model: str, out: str, per_device_batch_size: int, steps: int, vllm_mode: str | None = None):
    overrides = dict(per_device_train_batch_size=per_device_batch_size, max_steps=steps)
    if vllm_mode is not None:
        overrides.update(VLLM_OPTIONS, vllm_mode=vllm_mode)
    trainer = make_trainer(method, model, os.path.join(out, method), **overrides)
    recorder = ControllerRecorder()
    recorder.trainer = trainer
    trainer.add_callback(recorder)
    trainer.train()
    rank = trainer.accelerator.process_index
    weights = torch.cat([p.detach().flatten().double() for p in trainer.model.parameters()])
    record = {
        "method": method,
        "num_processes": trainer.accelerator.num_processes,
        "rank": rank,
        "controller": recorder.values,
        "loss": logged(trainer, "loss"),
        "entropy": logged(trainer, "entropy"),
        "reward": logged(trainer, "reward"),
        "weights_sum": weights.sum().item(),
        "weights_abs_sum": weights.abs().sum().item(),
        "weights_head": weights[:64].tolist(),
    }
    if vllm_mode is not None:
        record.update({key: logged(trainer, key) for key in VLLM_METRICS})
        record["train_runtime"] = trainer.state.log_history[-1].get("train_runtime")
    with open(os.path.join(out, f"{method}_rank{rank}.json"), "w") as file:
        json.dump(record, file)
    trainer.accelerator.wait_for_everyone()


def main(argv=None) -> None:
    from trl_entropy.methods import METHODS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="path of a saved toy policy")
    parser.add_argument("--out", required=True, help="folder for the per-rank records")
    parser.add_argument(
        "--methods", default=",".join(ADAPTIVE_METHODS), help="comma-separated registry names, or 'all'"
    )
    parser.add_argument("--per-device-batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--vllm",
        choices=["colocate", "server"],
        default=None,
        help="GPU smoke test: generate with vLLM in this mode (sampled completions, bf16 on CUDA). A missing --model "
        "folder is filled with a vLLM-friendly toy policy first.",
    )
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    os.makedirs(options.out, exist_ok=True)
    if options.vllm is not None and not os.path.exists(os.path.join(options.model, "config.json")):
        save_vllm_toy_policy(options.model)
    methods = sorted(METHODS) if options.methods == "all" else options.methods.split(",")
    for method in methods:
        run(method, options.model, options.out, options.per_device_batch_size, options.steps, options.vllm)


if __name__ == "__main__":
    sys.exit(main())
