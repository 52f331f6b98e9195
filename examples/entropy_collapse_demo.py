"""The entropy-collapse demo: every method on the warm-started toy policy, same budget, same seed.

    python examples/entropy_collapse_demo.py --output_dir outputs/demo

Trains GRPO, TRL's entropy bonus (EntReg) and each entropy-control method for `--max_steps` optimizer steps, prints a
table (initial, minimum and final entropy, final reward, wall time per method) and writes `entropy_collapse.png` (the
entropy and reward curves) and `history.json` (every logged value) into `--output_dir`. No network, CPU only.
"""

import json
import math
import os
import time
from dataclasses import dataclass, field

from trl import TrlParser

from trl_entropy.methods import METHODS, get_method


@dataclass
class DemoArguments:
    """The demo's budget. Everything else is the toy defaults of examples/train.py."""

    output_dir: str = field(default="outputs/demo", metadata={"help": "Where the table, PNG and history go."})
    methods: list[str] = field(
        default_factory=lambda: list(METHODS), metadata={"help": f"Methods to run, among {list(METHODS)}."}
    )
    max_steps: int = field(default=60, metadata={"help": "Optimizer steps per method (the shared budget)."})
    learning_rate: float = field(default=1e-3, metadata={"help": "Learning rate of every method."})
    per_device_train_batch_size: int = field(default=16, metadata={"help": "Completions per optimizer step."})
    num_generations: int = field(default=8, metadata={"help": "Completions per prompt (the GRPO group)."})
    max_completion_length: int = field(default=8, metadata={"help": "Maximal completion length in tokens."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})
    seed: int = field(default=0, metadata={"help": "Seed of the toy policy, the data and the training."})
    toy_policy_cache: str | None = field(
        default="outputs/toy_policy", metadata={"help": "Folder caching the warm-started toy policy."}
    )


def train_one(name: str, demo: DemoArguments, model_path: str, tokenizer, dataset):
    """Train one method from the cached policy; returns its per-step history and wall time."""
    from trl_entropy.toy import toy_reward

    method = get_method(name)
    args = method.config_class(
        output_dir=os.path.join(demo.output_dir, name),
        max_steps=demo.max_steps,
        learning_rate=demo.learning_rate,
        per_device_train_batch_size=demo.per_device_train_batch_size,
        num_generations=demo.num_generations,
        max_completion_length=demo.max_completion_length,
        temperature=demo.temperature,
        seed=demo.seed,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        disable_tqdm=True,
        **method.defaults,
    )
    trainer = method.trainer_class(
        model=model_path, reward_funcs=toy_reward, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    start = time.perf_counter()
    trainer.train()
    wall_time = time.perf_counter() - start
    history = [entry for entry in trainer.state.log_history if "entropy" in entry]
    return history, wall_time


def summarise(history: list[dict], wall_time: float) -> dict:
    entropy = [entry["entropy"] for entry in history]
    reward = [entry["reward"] for entry in history]
    tail = reward[-max(1, len(reward) // 10) :]  # the last tenth of the run: one step's reward is noisy
    return {
        "initial_entropy": entropy[0],
        "min_entropy": min(entropy),
        "final_entropy": entropy[-1],
        "final_reward": sum(tail) / len(tail),
        "wall_time_s": wall_time,
    }


def format_table(summaries: dict[str, dict]) -> str:
    header = f"{'method':<10} {'H initial':>10} {'H min':>8} {'H final':>8} {'reward (last 10%)':>18} {'wall s':>8}"
    lines = [header, "-" * len(header)]
    for name, s in summaries.items():
        lines.append(
            f"{name:<10} {s['initial_entropy']:>10.4f} {s['min_entropy']:>8.4f} {s['final_entropy']:>8.4f} "
            f"{s['final_reward']:>18.3f} {s['wall_time_s']:>8.1f}"
        )
    return "\n".join(lines)


def moving_average(values: list[float], window: int) -> list[float]:
    averaged = []
    for index in range(len(values)):
        chunk = values[max(0, index - window + 1) : index + 1]
        averaged.append(sum(chunk) / len(chunk))
    return averaged


def plot(histories: dict[str, list[dict]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (entropy_axis, reward_axis) = plt.subplots(1, 2, figsize=(13, 4.8))
    colours = plt.get_cmap("tab10")
    for index, (name, history) in enumerate(histories.items()):
        steps = list(range(1, len(history) + 1))
        style = dict(color=colours(index), linewidth=2.2 if name == "grpo" else 1.6)
        style["linestyle"] = "--" if name in ("grpo", "entreg") else "-"
        entropy_axis.plot(steps, [entry["entropy"] for entry in history], label=name, **style)
        window = max(1, len(history) // 10)
        reward_axis.plot(steps, moving_average([entry["reward"] for entry in history], window), label=name, **style)
    entropy_axis.set(title="Policy entropy (mean per token)", xlabel="optimizer step", ylabel="entropy (nats)")
    entropy_axis.set_yscale("log")
    reward_axis.set(title="Reward (moving average)", xlabel="optimizer step", ylabel="mean reward")
    for axis in (entropy_axis, reward_axis):
        axis.grid(alpha=0.3)
    entropy_axis.legend(ncol=2, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(demo: DemoArguments) -> dict[str, dict]:
    from trl_entropy.toy import build_toy_dataset, build_toy_policy

    for name in demo.methods:
        get_method(name)  # fail before any training on a bad name
    os.makedirs(demo.output_dir, exist_ok=True)
    model, tokenizer = build_toy_policy(seed=demo.seed, cache_dir=demo.toy_policy_cache)
    model_path = os.path.join(demo.output_dir, "initial_policy")
    model.save_pretrained(model_path)  # every method starts from these exact weights
    dataset = build_toy_dataset(demo.max_steps * demo.per_device_train_batch_size, seed=demo.seed)
    histories, summaries = {}, {}
    for name in demo.methods:
        history, wall_time = train_one(name, demo, model_path, tokenizer, dataset)
        histories[name] = history
        summaries[name] = summarise(history, wall_time)
        print(f"[demo] {name}: {summaries[name]}", flush=True)
    with open(os.path.join(demo.output_dir, "history.json"), "w") as file:
        json.dump({"arguments": vars(demo), "summaries": summaries, "histories": histories}, file, indent=1)
    plot(histories, os.path.join(demo.output_dir, "entropy_collapse.png"))
    print()
    print(format_table(summaries))
    print(f"\nCurves: {os.path.join(demo.output_dir, 'entropy_collapse.png')}")
    if any(not math.isfinite(s["final_entropy"]) for s in summaries.values()):
        raise RuntimeError("a method ended with a non-finite entropy")
    return summaries


if __name__ == "__main__":
    (demo_arguments,) = TrlParser((DemoArguments,)).parse_args_and_config()
    main(demo_arguments)
