"""The entropy-collapse demo: GRPO, EntReg and every entropy-control method on the toy task, same budget, same seed.

    python examples/entropy_collapse_demo.py --output_dir outputs/demo

Every run starts from the same warm-started toy policy (trl_entropy.toy) and trains for `--max_steps` optimizer steps
with the toy recipe of examples/train.py (`trl_entropy.methods.TOY_TRAINING_DEFAULTS`: 16 prompts, 8 completions
each, learning rate 3e-4, ...) and the same seed. Under plain GRPO the policy sharpens on its prompts: the reward rises
and the mean token entropy collapses. A method's own settings come from `examples/configs/<method>.yaml`, the same
files `examples/train.py --config` reads; `--paper_defaults` ignores them and runs every method with its library
defaults instead (the papers' values, sized for LLM batches: most of them barely act at toy scale).

Prints a table (entropy at the start, its minimum and final value, the final reward, the held-out success, the wall
time per method) and writes `entropy_collapse.png` (entropy and reward curves), `history.json` (every logged value)
and `table.md` into `--output_dir`. No network; CPU only; about a minute per method on one idle core.
"""

import json
import math
import os
import time
from dataclasses import dataclass, field

import yaml
from transformers import PrinterCallback
from trl import TrlParser

from trl_entropy.methods import METHODS, TOY_NUM_PROMPTS, TOY_TRAINING_DEFAULTS, get_method, toy_training_set


CONFIGS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
# The shared budget: a run's YAML config may not change these, or the comparison would not be like for like.
SHARED_SETTINGS = frozenset(TOY_TRAINING_DEFAULTS) | {"seed", "temperature", "output_dir"}


@dataclass
class DemoArguments:
    """The demo's runs and their shared budget; every other training setting is the toy recipe of examples/train.py."""

    output_dir: str = field(default="outputs/demo", metadata={"help": "Where the table, PNG and history go."})
    methods: list[str] = field(
        default_factory=lambda: list(METHODS),
        metadata={
            "help": f"Runs, in order: registered methods {list(METHODS)} or the name of any YAML config in "
            "--configs_dir (e.g. clip_low)."
        },
    )
    max_steps: int = field(
        default=TOY_TRAINING_DEFAULTS["max_steps"], metadata={"help": "Optimizer steps per run (the shared budget)."}
    )
    num_prompts: int = field(
        default=TOY_NUM_PROMPTS, metadata={"help": "Distinct toy problems every run trains on (at most 320)."}
    )
    seed: int = field(default=0, metadata={"help": "Seed of the toy policy, the prompts and the training."})
    paper_defaults: bool = field(
        default=False,
        metadata={"help": "Ignore the runs' YAML configs and train each method with its library (paper) defaults."},
    )
    configs_dir: str = field(
        default=CONFIGS_DIR, metadata={"help": "Folder of the per-run YAML configs (<name>.yaml)."}
    )
    smoothing: int = field(
        default=40, metadata={"help": "Window (optimizer steps) of the moving average in the plot and the table."}
    )
    toy_policy_cache: str | None = field(
        default="outputs/toy_policy", metadata={"help": "Folder caching the warm-started toy policy."}
    )

    def __post_init__(self):
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {self.max_steps}")
        if self.smoothing < 1:
            raise ValueError(f"smoothing must be at least 1, got {self.smoothing}")
        if not self.methods:
            raise ValueError("methods must name at least one run")


def run_settings(name: str, demo: DemoArguments) -> tuple[str, dict]:
    """The method and the method-specific config values of the run ``name``: its YAML config's, or none with
    ``paper_defaults`` (the method's registry defaults always apply)."""
    path = os.path.join(demo.configs_dir, f"{name}.yaml")
    if not os.path.exists(path):
        if name not in METHODS:
            raise ValueError(f"unknown run {name!r}: not a method ({sorted(METHODS)}) and there is no {path} config")
        return name, {}
    with open(path) as file:
        settings = yaml.safe_load(file) or {}
    method = settings.pop("method", name)
    get_method(method)
    shared = sorted(SHARED_SETTINGS & set(settings))
    if shared:
        raise ValueError(f"{path} sets {shared}, which the demo keeps equal for every run")
    return method, ({} if demo.paper_defaults else settings)


def train_one(name: str, demo: DemoArguments, model_path: str, tokenizer, dataset) -> tuple[list[dict], float, float]:
    """Train the run ``name`` from the saved initial policy; returns its per-step log, wall time and the held-out
    success of the trained policy (sampling at temperature 1)."""
    from trl_entropy.toy import toy_reward, toy_success_rate

    method_name, settings = run_settings(name, demo)
    method = get_method(method_name)
    training = dict(TOY_TRAINING_DEFAULTS, max_steps=demo.max_steps, logging_steps=1, disable_tqdm=True)
    values = {**training, **method.defaults, **settings}  # the run's config overrides the registry defaults
    args = method.config_class(output_dir=os.path.join(demo.output_dir, name), seed=demo.seed, **values)
    trainer = method.trainer_class(
        model=model_path, reward_funcs=toy_reward, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    trainer.remove_callback(PrinterCallback)  # no line per step: the demo prints one summary per run
    start = time.perf_counter()
    trainer.train()
    wall_time = time.perf_counter() - start
    history = [entry for entry in trainer.state.log_history if "entropy" in entry]
    held_out = toy_success_rate(trainer.model, tokenizer, n=256, seed=demo.seed)
    return history, wall_time, held_out


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing moving average (the first values average what there is so far)."""
    averaged, total = [], 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        averaged.append(total / min(index + 1, window))
    return averaged


def curves(history: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """(steps, values) of the entropy and of the reward. With num_iterations > 1 only the steps that generated
    completions log a reward."""
    steps = list(range(1, len(history) + 1))
    rewarded = [(step, entry["reward"]) for step, entry in zip(steps, history) if "reward" in entry]
    return {
        "entropy": (steps, [entry["entropy"] for entry in history]),
        "reward": ([step for step, _ in rewarded], [value for _, value in rewarded]),
    }


def summarise(history: list[dict], wall_time: float, held_out: float, window: int) -> dict:
    """The table's row: entropy at step 1, minimum and final value of its moving average, mean reward over the last
    tenth of the run, held-out success, wall time."""
    entropy = curves(history)["entropy"][1]
    reward = curves(history)["reward"][1]
    smoothed = moving_average(entropy, window)
    tail = reward[-max(1, len(reward) // 10) :]
    head = reward[: max(1, len(reward) // 10)]
    return {
        "initial_entropy": entropy[0],
        "min_entropy": min(smoothed),
        "final_entropy": smoothed[-1],
        "initial_reward": sum(head) / len(head),
        "final_reward": sum(tail) / len(tail),
        "held_out_success": held_out,
        "wall_time_s": wall_time,
    }


COLUMNS = (
    ("run", "{}"),
    ("H step 1", "{:.3f}"),
    ("H min", "{:.3f}"),
    ("H final", "{:.3f}"),
    ("reward first 10%", "{:.3f}"),
    ("reward last 10%", "{:.3f}"),
    ("held-out success", "{:.3f}"),
    ("wall s", "{:.0f}"),
)


def _rows(summaries: dict[str, dict]) -> list[list[str]]:
    keys = ("initial_entropy", "min_entropy", "final_entropy", "initial_reward", "final_reward", "held_out_success")
    rows = []
    for name, summary in summaries.items():
        values = [name, *(summary[key] for key in keys), summary["wall_time_s"]]
        rows.append([fmt.format(value) for (_, fmt), value in zip(COLUMNS, values)])
    return rows


def format_table(summaries: dict[str, dict]) -> str:
    """The summaries as an aligned text table."""
    headers = [title for title, _ in COLUMNS]
    rows = _rows(summaries)
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    lines = [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in [headers, *rows]
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def format_markdown_table(summaries: dict[str, dict]) -> str:
    """The summaries as a Markdown table."""
    headers = [title for title, _ in COLUMNS]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(summaries)]
    return "\n".join(lines)


def _label_line_ends(axis, ends: list[tuple[float, str, object]], gap: float = 0.045) -> None:
    """Write each run's name just right of its curve's last point, nudged apart (``gap`` in axes fractions) so the
    names never overlap. Call after the axis limits and scale are final."""
    to_fraction = axis.transData + axis.transAxes.inverted()
    x_end = axis.get_xlim()[1]
    placed = sorted((to_fraction.transform((x_end, value))[1], name, colour) for value, name, colour in ends)
    positions = [fraction for fraction, _, _ in placed]
    for index in range(1, len(positions)):
        positions[index] = max(positions[index], positions[index - 1] + gap)
    shift = max(0.0, positions[-1] - placed[-1][0]) / 2 if positions else 0.0  # spread both ways, not only upwards
    for (_, name, colour), position in zip(placed, positions):
        axis.annotate(
            name,
            xy=(1.0, position - shift),
            xycoords="axes fraction",
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=9,
            color=colour,
            annotation_clip=False,
        )


def plot(histories: dict[str, list[dict]], path: str, window: int, title: str = "") -> None:
    """Entropy and reward curves (moving averages over ``window`` optimizer steps), one line per run, each labelled
    at its end."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(15, 5.6))
    palette = plt.get_cmap("tab10")
    colour_index = 0
    ends: dict[int, list] = {0: [], 1: []}
    for name, history in histories.items():
        if name == "grpo":
            style = {"color": "black", "linewidth": 2.8, "zorder": 5}
        elif name == "entreg":
            style = {"color": "0.5", "linewidth": 2.0, "linestyle": "--", "zorder": 4}
        else:
            style = {"color": palette(colour_index % 10), "linewidth": 1.8}
            colour_index += 1
        for panel, (steps, values) in enumerate(curves(history).values()):
            # Rewards are logged only on generation steps: average over the same number of optimizer steps.
            points = max(1, round(window * len(values) / max(len(history), 1)))
            smoothed = moving_average(values, points)
            axes[panel].plot(steps, smoothed, label=name, **style)
            if smoothed:
                ends[panel].append((smoothed[-1], name, style["color"]))
    axes[0].set(
        title=f"Mean token entropy ({window}-step moving average, log scale)",
        xlabel="optimizer step",
        ylabel="entropy (nats)",
    )
    # A log scale keeps a run whose entropy explodes (a too-large fixed bonus drives it towards ln V ≈ 3.8) from
    # squashing the others, and shows a collapse as what it is: a steady fall by a factor.
    axes[0].set_yscale("log")
    low, high = axes[0].get_ylim()
    dense = high / low < 5  # a narrow range gets more ticks
    candidates = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0, 1.5, 2.0, 3.0, 4.0)
    if not dense:
        candidates = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 4.0)
    ticks = [tick for tick in candidates if low <= tick <= high]
    axes[0].set_yticks(ticks, [f"{tick:g}" for tick in ticks])
    axes[0].set_yticks([], minor=True)
    axes[1].set(
        title=f"Reward on the training prompts ({window}-step moving average)",
        xlabel="optimizer step",
        ylabel="mean reward (success rate)",
    )
    for panel, axis in enumerate(axes):
        axis.grid(alpha=0.3)
        axis.set_xlim(0, max(len(history) for history in histories.values()))
        _label_line_ends(axis, ends[panel])
    if title:
        figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    figure.subplots_adjust(wspace=0.22)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)


def main(demo: DemoArguments) -> dict[str, dict]:
    import torch

    from trl_entropy.toy import build_toy_policy

    torch.set_num_threads(1)  # the toy model is tiny: more threads only add overhead
    settings = {name: run_settings(name, demo) for name in demo.methods}  # fail before any training on a bad run
    os.makedirs(demo.output_dir, exist_ok=True)
    model, tokenizer = build_toy_policy(seed=demo.seed, cache_dir=demo.toy_policy_cache)
    model_path = os.path.join(demo.output_dir, "initial_policy")
    model.save_pretrained(model_path)  # every run starts from these exact weights
    tokenizer.save_pretrained(model_path)
    rows = demo.max_steps * TOY_TRAINING_DEFAULTS["per_device_train_batch_size"]
    dataset = toy_training_set(demo.num_prompts, rows, seed=demo.seed)
    histories, summaries = {}, {}
    for name in demo.methods:
        history, wall_time, held_out = train_one(name, demo, model_path, tokenizer, dataset)
        histories[name] = history
        summaries[name] = summarise(history, wall_time, held_out, demo.smoothing)
        print(f"[demo] {name}: {json.dumps({k: round(v, 4) for k, v in summaries[name].items()})}", flush=True)
    with open(os.path.join(demo.output_dir, "history.json"), "w") as file:
        json.dump(
            {
                "arguments": vars(demo),
                "training": TOY_TRAINING_DEFAULTS,
                "runs": {name: {"method": method, "settings": values} for name, (method, values) in settings.items()},
                "summaries": summaries,
                "histories": histories,
            },
            file,
            indent=1,
        )
    with open(os.path.join(demo.output_dir, "table.md"), "w") as file:
        file.write(format_markdown_table(summaries) + "\n")
    png = os.path.join(demo.output_dir, "entropy_collapse.png")
    title = f"Toy task, {demo.num_prompts} prompts, {demo.max_steps} steps, seed {demo.seed}" + (
        ", library defaults" if demo.paper_defaults else ", settings of examples/configs"
    )
    plot(histories, png, demo.smoothing, title)
    print()
    print(format_table(summaries))
    print(f"\nCurves: {png}")
    if any(not math.isfinite(s["final_entropy"]) for s in summaries.values()):
        raise RuntimeError("a run ended with a non-finite entropy")
    return summaries


if __name__ == "__main__":
    (demo_arguments,) = TrlParser((DemoArguments,)).parse_args_and_config()
    main(demo_arguments)
