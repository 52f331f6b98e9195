"""The entropy-collapse demo: what GRPO, EntReg and every entropy-control method do to the entropy, and what keeping it
buys, on the toy task with the same budget and seed.

    python examples/entropy_collapse_demo.py --output_dir outputs/demo
    python examples/entropy_collapse_demo.py --output_dir outputs/demo_full --full   # 5 seeds, pass@k up to 32
    python examples/entropy_collapse_demo.py --from_history outputs/demo_full/history.json  # the tables again

Every run starts from the same toy policy (trl_entropy.toy), warm-started on two tasks that share its tokenizer:
task A, addition ("7+12="), and task B, subtraction ("7-12="), where it succeeds about a third of the time.

* **Phase 1.** Each run trains on task A (a fixed pool of `--num_prompts` problems) for `--max_steps` optimizer steps
  with its method and the toy recipe of examples/train.py (`trl_entropy.toy.TOY_TRAINING_DEFAULTS`). A method's
  own settings come from `examples/configs/<run>.yaml` (`--paper_defaults` ignores them). The entropy–reward law
  `R = −a·exp(H) + b` (Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
  arXiv:2505.22617, eq. 6) is fitted on the run's logged (entropy, reward) pairs by `EntropyLawCallback`.
* **Evaluation.** pass@k for k = 1, 2, 4 … `--num_samples` on every held-out problem of task A (80 prompts the runs
  never train on), `--num_samples` completions each at the training temperature (`evaluate_pass_at_k`).
* **Phase 2** (Petrenko et al., "Entropy-Preserving Reinforcement Learning", arXiv:2603.11682, §6.3: sequential
  learning). Every phase-1 policy is trained with plain GRPO on task B for `--phase2_steps` (default: the same
  budget); the table reports its training-reward gain on task B and held-out task-B pass@1 before and after.

Writes `table.md` (both tables: means with 95 % intervals and differences to GRPO, from a two-level bootstrap over
seeds and held-out problems, `trl_entropy.evaluation.bootstrap`; then every number), `entropy_collapse.png` (entropy
and reward curves of both phases, pass@k against k, task-B success before and after phase 2) and `history.json`
(every logged value, each held-out problem's correct count, every run's settings, the torch / transformers / trl
versions, the git commit, the CPU model and the ATen CPU capability) into `--output_dir`, and each run's
`trainer_state.json` (its log history and held-out pass@k, for `trl-entropy report`) into its own folder
(`seed<N>/<run>/phase<1|2>`). `--from_history` recomputes the tables and the PNG from a saved history.json.

One seed (the default) shows what happens on one run; its intervals cover the held-out problems only. Whether a
method differs from GRPO needs `--full` (5 seeds): the numbers move with the CPU's numeric path (docs/demo.md).
Runs go to `--workers` processes (one thread each: the model is tiny). No network; CPU only; about 3 minutes on two
idle cores (docs/demo.md has the measurements).
"""

# The matplotlib check comes before the slow imports (torch, transformers, TRL), so the imports after it are late.
# ruff: noqa: E402
import sys


def require_matplotlib() -> None:
    """Stop (status 2) before any training when the PNG could not be drawn, naming the extra that installs it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        print(
            f"entropy_collapse_demo.py: error: the demo draws its curves with matplotlib, which cannot be imported "
            f"({error}). Install the 'plot' extra: pip install -e \".[plot]\" (in the trl_entropy clone), or: "
            "pip install matplotlib",
            file=sys.stderr,
        )
        sys.exit(2)


if __name__ == "__main__":
    require_matplotlib()

import json
import math
import os
import platform
import queue
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import yaml
from transformers import PrinterCallback, TrainerCallback
from trl import TrlParser

from trl_entropy.methods import METHODS, get_method
from trl_entropy.toy import TOY_NUM_PROMPTS, TOY_TRAINING_DEFAULTS, toy_training_set
from trl_entropy.upstream_noise import hide_known_upstream_noise


CONFIGS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
# The shared budget: a run's YAML config may not change these, or the comparison would not be like for like.
SHARED_SETTINGS = frozenset(TOY_TRAINING_DEFAULTS) | {"seed", "temperature", "output_dir"}
TASK_A, TASK_B = "+", "-"  # phase 1 trains on addition, phase 2 on subtraction
TASK_NAMES = {TASK_A: "addition", TASK_B: "subtraction"}
# Supervised warm-start steps on both tasks: the policy then solves about a third of either task's held-out problems
# sampling at temperature 1 (seed 0: 0.34 on both), so GRPO has an advantage signal on each.
WARM_START_STEPS = 450
# --full: enough seeds for the intervals over seeds to say which differences to GRPO hold.
FULL_SEEDS = 5


@dataclass
class DemoArguments:
    """The demo's runs and their shared budget; every other training setting is the toy recipe of examples/train.py."""

    output_dir: str = field(default="outputs/demo", metadata={"help": "Where the tables, PNG and history go."})
    methods: list[str] = field(
        default_factory=lambda: list(METHODS),
        metadata={
            "help": f"Runs, in order: registered methods {list(METHODS)} or the name of any YAML config in "
            "--configs_dir (e.g. clip_low)."
        },
    )
    max_steps: int = field(
        default=TOY_TRAINING_DEFAULTS["max_steps"],
        metadata={"help": "Phase-1 optimizer steps per run (the shared budget)."},
    )
    phase2_steps: int | None = field(
        default=None,
        metadata={"help": "Phase-2 (plain GRPO on task B) optimizer steps per run; default --max_steps; 0 skips it."},
    )
    num_prompts: int = field(
        default=TOY_NUM_PROMPTS, metadata={"help": "Distinct problems every run trains on, per task (at most 320)."}
    )
    seed: int = field(default=0, metadata={"help": "Seed of the toy policy, the prompts, the training and sampling."})
    num_seeds: int = field(
        default=1, metadata={"help": "Repeat everything with seeds seed, seed+1, ...; tables show the mean."}
    )
    num_samples: int = field(
        default=16, metadata={"help": "Completions sampled per held-out prompt: pass@k for k = 1, 2, 4 ... this."}
    )
    full: bool = field(
        default=False,
        metadata={
            "help": f"The longer run: {FULL_SEEDS} seeds and pass@k up to k = 32 (about five times the cost); the "
            "claims that compare methods need it."
        },
    )
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
    workers: int = field(
        default=2, metadata={"help": "Runs trained at the same time, each in its own single-threaded process."}
    )
    from_history: str | None = field(
        default=None,
        metadata={
            "help": "Train nothing: recompute the tables (with intervals) and the PNG from this saved history.json, "
            "writing table.md and entropy_collapse.png beside it."
        },
    )
    worker: bool = field(
        default=False,
        metadata={"help": "Internal: serve jobs, reading job files' paths from stdin (how the demo uses workers)."},
    )

    def __post_init__(self):
        if self.full:
            self.num_seeds, self.num_samples = max(self.num_seeds, FULL_SEEDS), max(self.num_samples, 32)
        if self.phase2_steps is None:
            self.phase2_steps = self.max_steps
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {self.max_steps}")
        if self.phase2_steps < 0:
            raise ValueError(f"phase2_steps must be at least 0 (0 skips phase 2), got {self.phase2_steps}")
        if self.smoothing < 1:
            raise ValueError(f"smoothing must be at least 1, got {self.smoothing}")
        if self.num_seeds < 1:
            raise ValueError(f"num_seeds must be at least 1, got {self.num_seeds}")
        if self.num_samples < 1:
            raise ValueError(f"num_samples must be at least 1, got {self.num_samples}")
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
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


# ---------------------------------------------------------------------------------------------------------------------
# One job: train (or not) one policy on one task, then evaluate it on the held-out problems of both tasks
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class Job:
    """Phase 0 evaluates the initial policy, phase 1 trains a run on task A, phase 2 trains its result on task B."""

    name: str
    phase: int
    seed: int
    method: str
    settings: dict
    model_path: str
    output_dir: str
    steps: int
    num_prompts: int
    num_samples: int

    @property
    def key(self) -> str:
        return f"seed {self.seed} / {self.name} / phase {self.phase}"

    @property
    def policy_path(self) -> str:
        return os.path.join(self.output_dir, "policy")

    @property
    def job_path(self) -> str:
        return os.path.join(self.output_dir, "job.json")

    @property
    def result_path(self) -> str:
        return os.path.join(self.output_dir, "result.json")


class StepReporter(TrainerCallback):
    """Calls ``report()`` after every optimizer step (the demo's progress bar)."""

    def __init__(self, report):
        self.report = report

    def on_step_end(self, args, state, control, **kwargs):
        self.report()


def task_training_set(operator: str, num_prompts: int, num_rows: int, seed: int):
    """Task A is the toy recipe's training set; task B is the same construction over subtraction problems."""
    return toy_training_set(num_prompts, num_rows, seed=seed, operators=(operator,))


def held_out_set(operator: str):
    """Every held-out problem of one task (80), in a fixed order."""
    from trl_entropy.toy import build_toy_dataset, toy_problems

    return build_toy_dataset(len(toy_problems("test", (operator,))), split="test", operators=(operator,))


def run_job(job: Job, report=lambda: None) -> dict:
    """Train and evaluate one job in this process; returns its log, pass@k on both tasks, law fit and timings."""
    import torch
    from transformers import PreTrainedTokenizerFast

    from trl_entropy.evaluation import EntropyLawCallback, count_correct, pass_at_k, pass_at_k_values
    from trl_entropy.toy import toy_reward

    torch.set_num_threads(1)  # the toy model is tiny: more threads only add overhead
    method = get_method(job.method)
    batch = TOY_TRAINING_DEFAULTS["per_device_train_batch_size"]
    training = dict(TOY_TRAINING_DEFAULTS, max_steps=max(job.steps, 1), logging_steps=1, disable_tqdm=True)
    values = {**training, **method.defaults, **job.settings}  # the run's config overrides the registry defaults
    args = method.config_class(output_dir=job.output_dir, seed=job.seed, **values)
    operator = TASK_B if job.phase == 2 else TASK_A
    tokenizer = PreTrainedTokenizerFast.from_pretrained(job.model_path)
    trainer = method.trainer_class(
        model=job.model_path,
        reward_funcs=toy_reward,
        args=args,
        train_dataset=task_training_set(operator, job.num_prompts, max(job.steps, 1) * batch, job.seed),
        processing_class=tokenizer,
    )
    trainer.remove_callback(PrinterCallback)  # no line per step: the demo prints one summary per run
    trainer.add_callback(EntropyLawCallback(trainer))
    trainer.add_callback(StepReporter(report))
    wall_start, cpu_start = time.perf_counter(), time.process_time()
    if job.steps > 0:
        trainer.train()
    wall_time, cpu_time = time.perf_counter() - wall_start, time.process_time() - cpu_start
    correct, pass_at = {}, {}
    for task in (TASK_A, TASK_B):
        held_out = held_out_set(task)
        counts = count_correct(trainer, held_out, job.num_samples, prompts_per_batch=len(held_out), seed=job.seed)
        correct[task] = counts.tolist()
        pass_at[task] = {
            str(k): float(pass_at_k(job.num_samples, counts, k).mean()) for k in pass_at_k_values(job.num_samples)
        }
    if job.phase == 1:
        trainer.save_model(job.policy_path)
        tokenizer.save_pretrained(job.policy_path)
    laws = [entry for entry in trainer.state.log_history if "entropy/law_a" in entry]
    history = [entry for entry in trainer.state.log_history if "entropy" in entry]
    write_trainer_state(trainer, job, pass_at)
    return {
        "history": history,
        "pass_at_k": pass_at,
        # Correct completions out of num_samples per held-out problem, in held_out_set's order: what the intervals
        # resample.
        "correct": correct,
        "law": {key: laws[-1][f"entropy/{key}"] for key in ("law_a", "law_b", "predicted_ceiling")} if laws else None,
        "wall_time_s": wall_time,
        "cpu_time_s": cpu_time,
    }


def write_trainer_state(trainer, job: Job, pass_at: dict[str, dict[str, float]]) -> None:
    """Save the Trainer's state (its log_history) as ``trainer_state.json`` in the job's folder, with the held-out
    evaluation logged at the last step as ``trl-entropy report`` reads it: ``eval/pass@k`` on the task the job trains
    on (task A for the start policy), ``eval/<other task>/pass@k`` on the other."""
    trained = TASK_B if job.phase == 2 else TASK_A
    entry = {f"eval/pass@{k}": value for k, value in pass_at[trained].items()}
    for task in (TASK_A, TASK_B):
        if task != trained:
            entry |= {f"eval/{TASK_NAMES[task]}/pass@{k}": value for k, value in pass_at[task].items()}
    trainer.state.log_history.append({**entry, "step": trainer.state.global_step})
    trainer.state.save_to_json(os.path.join(job.output_dir, "trainer_state.json"))


def execute(jobs: list[Job], after: dict[str, Job], workers: int, output_dir: str) -> dict[str, dict]:
    """Run ``jobs`` and, as each one finishes, the job ``after`` it (phase 2 of a phase-1 run), ``workers`` at a
    time, with a progress bar over the optimizer steps; returns the results by job key."""
    from tqdm.auto import tqdm

    total = sum(job.steps for job in jobs) + sum(job.steps for job in after.values())
    bar = tqdm(total=total, unit="step", desc="training", dynamic_ncols=True)
    results: dict[str, dict] = {}

    def finish(job: Job, result: dict) -> None:
        results[job.key] = result
        line = f"[demo] {job.key}: {job.steps} steps in {result['wall_time_s']:.0f} s"
        if job.phase:
            line += f", task-A pass@1 {result['pass_at_k'][TASK_A]['1']:.3f}"
        bar.write(line + f", task-B pass@1 {result['pass_at_k'][TASK_B]['1']:.3f}")

    pending = list(jobs)
    if workers == 1:
        while pending:
            job = pending.pop(0)
            finish(job, run_job(job, report=lambda: bar.update(1)))
            if job.key in after:
                pending.insert(0, after[job.key])
        bar.close()
        return results

    # Worker processes stay up and take one job after another (a job file's path on their stdin), so the imports are
    # paid once per worker; each prints "step" per optimizer step and "done" per job.
    events: queue.Queue = queue.Queue()
    log_dir = os.path.join(output_dir, "logs")
    os.makedirs(log_dir, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    processes, assigned = [], {}

    def watch(index: int, process: subprocess.Popen) -> None:
        for line in process.stdout:
            if line.strip() in ("step", "done"):
                events.put((line.strip(), index))
        events.put(("exit", index, process.wait()))

    for index in range(min(workers, len(jobs))):
        with open(os.path.join(log_dir, f"worker{index}.txt"), "w") as log:
            process = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
            )
        processes.append(process)
        threading.Thread(target=watch, args=(index, process), daemon=True).start()
    idle = list(range(len(processes)))
    try:
        while pending or assigned:
            while pending and idle:
                index, job = idle.pop(0), pending.pop(0)
                os.makedirs(job.output_dir, exist_ok=True)
                with open(job.job_path, "w") as file:
                    json.dump(asdict(job), file)
                processes[index].stdin.write(job.job_path + "\n")
                processes[index].stdin.flush()
                assigned[index] = job
            kind, index, *code = events.get()
            if kind == "step":
                bar.update(1)
            elif kind == "exit":  # a worker only exits by itself when a job fails
                with open(os.path.join(log_dir, f"worker{index}.txt")) as log:
                    tail = log.read()[-3000:]
                job = assigned.get(index)
                raise RuntimeError(
                    f"{job.key if job else 'a worker'} failed (exit code {code[0]}); its log ends:\n{tail}"
                )
            else:
                job = assigned.pop(index)
                idle.append(index)
                with open(job.result_path) as file:
                    finish(job, json.load(file))
                if job.key in after:
                    pending.insert(0, after[job.key])
    finally:
        bar.close()
        for process in processes:
            if assigned:  # stopped by an error: do not wait for the other jobs
                process.kill()
            process.stdin.close()
            process.wait()
    return results


def serve_jobs() -> None:
    """The worker's side: run each job whose file path arrives on stdin, one per line, until stdin closes."""
    for line in sys.stdin:
        with open(line.strip()) as file:
            job = Job(**json.load(file))
        result = run_job(job, report=lambda: print("step", flush=True))
        with open(job.result_path + ".tmp", "w") as file:
            json.dump(result, file)
        os.replace(job.result_path + ".tmp", job.result_path)
        print("done", flush=True)


# ---------------------------------------------------------------------------------------------------------------------
# Summaries and tables
# ---------------------------------------------------------------------------------------------------------------------


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


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def summarise(phase1: dict, phase2: dict | None, window: int) -> dict:
    """One run at one seed: entropy at step 1, minimum and final value of its moving average, mean reward over the
    first and last tenth of each phase (the phase-2 gain is their difference on task B), held-out pass@k, the law
    fit, held-out task-B success before and after phase 2."""
    entropy = curves(phase1["history"])["entropy"][1]
    reward = curves(phase1["history"])["reward"][1]
    smoothed = moving_average(entropy, window)
    tenth = max(1, len(reward) // 10)
    law = phase1["law"] or {}
    summary = {
        "initial_entropy": entropy[0],
        "min_entropy": min(smoothed),
        "final_entropy": smoothed[-1],
        "initial_reward": _mean(reward[:tenth]),
        "final_reward": _mean(reward[-tenth:]),
        "held_out_success": phase1["pass_at_k"][TASK_A]["1"],
        "pass_at_k": {int(k): value for k, value in phase1["pass_at_k"][TASK_A].items()},
        "law_a": law.get("law_a", math.nan),
        "law_b": law.get("law_b", math.nan),
        "law_ceiling": law.get("predicted_ceiling", math.nan),
        "b_start": phase1["pass_at_k"][TASK_B]["1"],
        "wall_time_s": phase1["wall_time_s"],
        "cpu_time_s": phase1["cpu_time_s"],
    }
    if phase2 is not None:
        b_reward = curves(phase2["history"])["reward"][1]
        b_tenth = max(1, len(b_reward) // 10)
        summary |= {
            "b_initial_reward": _mean(b_reward[:b_tenth]),
            "b_final_reward": _mean(b_reward[-b_tenth:]),
            "b_end": phase2["pass_at_k"][TASK_B]["1"],
            "phase2_gain": _mean(b_reward[-b_tenth:]) - _mean(b_reward[:b_tenth]),
            "a_after_phase2": phase2["pass_at_k"][TASK_A]["1"],
            "phase2_wall_time_s": phase2["wall_time_s"],
        }
    return summary


def average(per_seed: list[dict]) -> dict:
    """The mean of every number over seeds (pass@k per k); each seed's phase-2 gain and held-out task-B pass@1 after
    phase 2 are kept as lists."""
    averaged = {}
    for key, value in per_seed[0].items():
        if isinstance(value, dict):
            averaged[key] = {k: _mean([summary[key][k] for summary in per_seed]) for k in value}
        else:
            averaged[key] = _mean([summary[key] for summary in per_seed])
    if "phase2_gain" in averaged:
        averaged["phase2_gains"] = [summary["phase2_gain"] for summary in per_seed]
        averaged["b_ends"] = [summary["b_end"] for summary in per_seed]
    return averaged


def _cell(key: str, fmt: str):
    """A column's cell: ``summary[key]`` formatted, "–" where there is no value (a law that was never well posed)."""

    def cell(summary: dict) -> str:
        value = summary[key]
        return "–" if isinstance(value, float) and math.isnan(value) else fmt.format(value)

    return cell


def phase1_columns(num_samples: int) -> list[tuple[str, object]]:
    """The phase-1 table: (title, cell) per column."""
    return [
        ("H step 1", _cell("initial_entropy", "{:.3f}")),
        ("H min", _cell("min_entropy", "{:.3f}")),
        ("H final", _cell("final_entropy", "{:.3f}")),
        ("reward first 10%", _cell("initial_reward", "{:.3f}")),
        ("reward last 10%", _cell("final_reward", "{:.3f}")),
        ("held-out success (pass@1)", _cell("held_out_success", "{:.3f}")),
        (f"pass@{num_samples}", lambda summary: f"{summary['pass_at_k'][num_samples]:.3f}"),
        ("law a", _cell("law_a", "{:.3f}")),
        ("law b", _cell("law_b", "{:.3f}")),
        ("ceiling b−a", _cell("law_ceiling", "{:.3f}")),
        ("wall s", _cell("wall_time_s", "{:.0f}")),
    ]


def phase2_columns(num_seeds: int) -> list[tuple[str, object]]:
    """The phase-2 table: (title, cell) per column; with several seeds, each seed's gain too."""
    columns = [
        ("B reward first 10%", _cell("b_initial_reward", "{:.3f}")),
        ("B reward last 10%", _cell("b_final_reward", "{:.3f}")),
        ("phase-2 gain", _cell("phase2_gain", "{:+.3f}")),
        ("B held-out pass@1 before", _cell("b_start", "{:.3f}")),
        ("after", _cell("b_end", "{:.3f}")),
        ("A held-out pass@1 after", _cell("a_after_phase2", "{:.3f}")),
        ("wall s", _cell("phase2_wall_time_s", "{:.0f}")),
    ]
    if num_seeds > 1:
        columns.append(("gain per seed", lambda summary: " / ".join(f"{g:+.3f}" for g in summary["phase2_gains"])))
    return columns


# The intervals: (title, measure) per quantity, each shown as its mean [95 % interval] and its difference to GRPO.
BASELINE = "grpo"


def phase1_interval_columns(num_samples: int) -> list[tuple[str, str]]:
    return [
        ("H final", "final_entropy"),
        ("reward last 10%", "final_reward"),
        ("pass@1", "pass@1"),
        (f"pass@{num_samples}", f"pass@{num_samples}"),
    ]


PHASE2_INTERVAL_COLUMNS = [
    ("phase-2 gain", "phase2_gain"),
    ("B pass@1 after", "b_end"),
    ("A pass@1 after", "a_after_phase2"),
]
# Measured once per run; the others once per held-out problem.
PER_RUN_MEASURES = frozenset({"final_entropy", "final_reward", "phase2_gain"})


def run_measures(phases: dict, num_samples: int, smoothing: int) -> dict:
    """One seed's run (its phases' results): each per-run measure as a number, each held-out measure as one value per
    problem (pass@1 is the problem's fraction of correct samples, pass@n whether any is correct)."""
    from trl_entropy.evaluation import pass_at_k

    summary = summarise(phases["1"], phases.get("2"), smoothing)
    counts = np.asarray(phases["1"]["correct"][TASK_A])
    measures = {
        "final_entropy": summary["final_entropy"],
        "final_reward": summary["final_reward"],
        "pass@1": counts / num_samples,
        f"pass@{num_samples}": pass_at_k(num_samples, counts, num_samples),
    }
    if "2" in phases:
        measures |= {
            "phase2_gain": summary["phase2_gain"],
            "b_end": np.asarray(phases["2"]["correct"][TASK_B]) / num_samples,
            "a_after_phase2": np.asarray(phases["2"]["correct"][TASK_A]) / num_samples,
        }
    return measures


def interval_summaries(runs: dict[str, list[dict]], num_samples: int, smoothing: int) -> dict[str, dict]:
    """``{run: {measure: (interval, difference to GRPO)}}`` over the seeds (``runs[name]``: each seed's phases, in
    the same seed order for every run) and the held-out problems: the two-level bootstrap of
    trl_entropy.evaluation.bootstrap, paired with GRPO's run of the same seed. With one seed a per-run measure has
    no interval (``None``); the difference is ``None`` for GRPO itself or when GRPO was not run."""
    from trl_entropy.evaluation import bootstrap_difference, bootstrap_mean

    tables = {}
    for name, seeds in runs.items():
        per_seed = [run_measures(phases, num_samples, smoothing) for phases in seeds]
        tables[name] = {
            key: np.stack([np.asarray(measures[key], dtype=np.float64) for measures in per_seed])
            for key in per_seed[0]
        }
    intervals = {}
    for name, measures in tables.items():
        intervals[name] = {}
        for key, table in measures.items():
            single = key in PER_RUN_MEASURES and table.shape[0] == 1
            interval = bootstrap_mean(table)
            difference = None
            if name != BASELINE and BASELINE in tables:
                difference = bootstrap_difference(table, tables[BASELINE][key])
            if single:  # one number: report it, without a spread
                interval = replace(interval, low=math.nan, high=math.nan)
                if difference is not None:
                    difference = replace(difference, low=math.nan, high=math.nan)
            intervals[name][key] = (interval, difference)
    return intervals


def interval_scope(num_seeds: int) -> str:
    """What the intervals resample, and which claims need --full."""
    if num_seeds == 1:
        return (
            "one seed: the intervals resample the 80 held-out problems only, not the seed-to-seed spread, and per-run "
            "numbers (entropy, training reward, phase-2 gain) have none; whether a method differs from GRPO needs "
            f"--full ({FULL_SEEDS} seeds)"
        )
    return (
        f"two-level bootstrap over the {num_seeds} seeds and, within each, the 80 held-out problems; each difference "
        "to GRPO paired (the same seeds and problems resampled for both)"
    )


def _interval_text(interval, signed: bool) -> str:
    if interval is None:
        return "–"
    sign = "+" if signed else ""
    text = f"{interval.mean:{sign}.3f}"
    if math.isnan(interval.low):
        return text
    return text + f" [{interval.low:{sign}.3f}, {interval.high:{sign}.3f}]"


def format_interval_table(
    intervals: dict[str, dict], columns: list[tuple[str, str]], num_seeds: int, suffix: str = ""
) -> str:
    """A Markdown table: per quantity, the mean [95 % interval] and the difference to GRPO [95 % interval]."""
    headers = ["run" + suffix]
    for title, _ in columns:
        headers += [title, f"Δ {title} vs {BASELINE}"]
    rows = []
    for name, measures in intervals.items():
        row = [name + suffix]
        for _, key in columns:
            interval, difference = measures[key]
            row += [_interval_text(interval, signed=False), _interval_text(difference, signed=True)]
        rows.append(row)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _table(summaries: dict[str, dict], columns: list[tuple[str, object]], suffix: str) -> list[list[str]]:
    """Header and rows; a run is named with ``suffix`` appended (phase 2 of run "grpo" is "grpo→B")."""
    headers = ["run" + suffix] + [title for title, _ in columns]
    return [headers] + [
        [name + suffix] + [cell(summary) for _, cell in columns] for name, summary in summaries.items()
    ]


def format_table(summaries: dict[str, dict], columns: list[tuple[str, object]], suffix: str = "") -> str:
    """The summaries as an aligned text table."""
    headers, *rows = _table(summaries, columns, suffix)
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
    lines = [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in [headers, *rows]
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def format_markdown_table(summaries: dict[str, dict], columns: list[tuple[str, object]], suffix: str = "") -> str:
    """The summaries as a Markdown table."""
    headers, *rows = _table(summaries, columns, suffix)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


# ---------------------------------------------------------------------------------------------------------------------
# The figure
# ---------------------------------------------------------------------------------------------------------------------


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
            fontsize=8.5,
            color=colour,
            annotation_clip=False,
        )


def run_styles(names: list[str]) -> dict[str, dict]:
    """GRPO thick black, EntReg dashed grey, every method its own colour."""
    import matplotlib.pyplot as plt

    palette, styles, index = plt.get_cmap("tab10"), {}, 0
    for name in names:
        if name == "grpo":
            styles[name] = {"color": "black", "linewidth": 2.6, "zorder": 5}
        elif name == "entreg":
            styles[name] = {"color": "0.5", "linewidth": 2.0, "linestyle": "--", "zorder": 4}
        else:
            styles[name] = {"color": palette(index % 10), "linewidth": 1.7}
            index += 1
    return styles


def mean_curve(histories: list[list[dict]], metric: str, window: int) -> tuple[list[int], list[float]]:
    """The seeds' mean of a metric's moving average (over ``window`` optimizer steps)."""
    smoothed = []
    for history in histories:
        steps, values = curves(history)[metric]
        points = max(1, round(window * len(values) / max(len(history), 1)))  # rewards come every other step
        smoothed.append(moving_average(values, points))
    length = min(len(values) for values in smoothed)
    return steps[:length], [_mean([values[i] for values in smoothed]) for i in range(length)]


def _entropy_ticks(axis) -> None:
    low, high = axis.get_ylim()
    candidates = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 4.0)
    ticks = [tick for tick in candidates if low <= tick <= high]
    axis.set_yticks(ticks, [f"{tick:g}" for tick in ticks])
    axis.set_yticks([], minor=True)


def plot(
    phase1: dict[str, list[list[dict]]],
    phase2: dict[str, list[list[dict]]],
    summaries: dict[str, dict],
    initial_pass_at_k: dict[int, float],
    path: str,
    window: int,
    title: str = "",
) -> list[str]:
    """Top row, phase 1 on task A: entropy (log scale), training reward, held-out pass@k against k. Bottom row,
    phase 2 (plain GRPO on task B from each phase-1 policy): entropy, training reward, and held-out task-B pass@1
    before and after. Curves are moving averages over ``window`` optimizer steps (means over seeds). Returns the
    panels' titles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(phase1)
    styles = run_styles(names)
    rows = 2 if phase2 else 1
    figure, axes = plt.subplots(rows, 3, figsize=(19, 5.4 * rows), squeeze=False)
    panels = [(0, phase1, "task A (addition), phase 1")]
    if phase2:
        panels.append((1, phase2, "task B (subtraction), phase 2 (GRPO)"))
    for row, histories, label in panels:
        entropy_axis, reward_axis = axes[row][0], axes[row][1]
        ends = {0: [], 1: []}
        for name in names:
            for column, metric in enumerate(("entropy", "reward")):
                steps, values = mean_curve(histories[name], metric, window)
                axes[row][column].plot(steps, values, label=name, **styles[name])
                if values:
                    ends[column].append((values[-1], name, styles[name]["color"]))
        entropy_axis.set(title=f"Mean token entropy, {label}", xlabel="optimizer step", ylabel="entropy (nats)")
        entropy_axis.set_yscale("log")  # a collapse is a fall by a factor; an exploding run does not squash the rest
        _entropy_ticks(entropy_axis)
        reward_axis.set(title=f"Training reward, {label}", xlabel="optimizer step", ylabel="mean reward (success)")
        for column, axis in enumerate((entropy_axis, reward_axis)):
            axis.grid(alpha=0.3)
            axis.set_xlim(0, max(len(history) for runs in histories.values() for history in runs))
            _label_line_ends(axis, ends[column])

    ks = sorted(initial_pass_at_k)
    pass_axis = axes[0][2]
    pass_axis.plot(ks, [initial_pass_at_k[k] for k in ks], color="black", linestyle=":", marker="o", label="start")
    for name in names:
        pass_at_k = summaries[name]["pass_at_k"]
        pass_axis.plot(ks, [pass_at_k[k] for k in ks], marker="o", markersize=3.5, label=name, **styles[name])
    pass_axis.set_xscale("log", base=2)
    pass_axis.set_xticks(ks, [str(k) for k in ks])
    pass_axis.set(
        title="Held-out pass@k, task A, after phase 1",
        xlabel="k (samples per problem)",
        ylabel="pass@k (80 held-out problems)",
    )
    pass_axis.grid(alpha=0.3)
    pass_axis.legend(fontsize=8, loc="upper left")  # the curves rise from the lower left

    if phase2:
        gain_axis = axes[1][2]
        for position, name in enumerate(names):
            summary, colour = summaries[name], styles[name]["color"]
            gain_axis.annotate(
                "",
                xy=(position, summary["b_end"]),
                xytext=(position, summary["b_start"]),
                arrowprops={"arrowstyle": "->", "color": colour, "linewidth": 2},
            )
            gain_axis.plot([position], [summary["b_start"]], marker="o", color=colour, markerfacecolor="white")
            gain_axis.plot([position], [summary["b_end"]], marker="o", color=colour)
            if len(summary["b_ends"]) > 1:  # each seed's end point, to show the spread
                seeds = summary["b_ends"]
                gain_axis.scatter([position + 0.15] * len(seeds), seeds, s=12, color=colour, alpha=0.6)
        gain_axis.set_xticks(range(len(names)), names, rotation=30)
        gain_axis.set(
            title="Held-out pass@1, task B: before (o) and after (●) phase 2",
            ylabel="pass@1 (80 held-out problems)",
        )
        gain_axis.grid(alpha=0.3, axis="y")
    if title:
        figure.suptitle(title, fontsize=11)
    figure.tight_layout()
    figure.subplots_adjust(wspace=0.28, hspace=0.32)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    titles = [axis.get_title() for axis in figure.axes]
    plt.close(figure)
    return titles


# ---------------------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------------------


def versions() -> dict:
    """What the numbers came from: library versions, Python, the machine, the git commit of this checkout (taken when
    the demo starts)."""
    import torch
    import transformers
    import trl

    import trl_entropy
    from trl_entropy.toy import cpu_path

    def git(*arguments: str) -> str | None:
        try:
            return subprocess.run(
                ["git", *arguments],
                cwd=os.path.dirname(os.path.abspath(__file__)),
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    changed = git("status", "--porcelain", "--", ":/trl_entropy", ":/kernels", ":/examples")
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "trl_entropy": trl_entropy.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
        "cpu_model": cpu_model(),
        # The vectorised kernels the runs computed with (ATEN_CPU_CAPABILITY): another path samples other tokens.
        "aten_cpu_capability": cpu_path(),
        "git_commit": git("rev-parse", "--short", "HEAD"),
        # Uncommitted changes to the code the runs import, when there are any (the numbers may not match the commit).
        "git_uncommitted": changed.splitlines() if changed else [],
    }


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux; what the platform module reports elsewhere)."""
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_seconds() -> float:
    """CPU time used so far by this process and its finished worker processes (user + system)."""
    import resource

    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(item.ru_utime + item.ru_stime for item in usage)


def main(demo: DemoArguments) -> dict[str, dict]:
    from trl_entropy.toy import build_toy_policy

    require_matplotlib()
    settings = {name: run_settings(name, demo) for name in demo.methods}  # fail before any training on a bad run
    provenance = versions()
    os.makedirs(demo.output_dir, exist_ok=True)
    seeds = [demo.seed + offset for offset in range(demo.num_seeds)]
    jobs, after = [], {}
    grpo_settings = run_settings("grpo", demo)[1]
    for seed in seeds:
        seed_dir = os.path.join(demo.output_dir, f"seed{seed}")
        model, tokenizer = build_toy_policy(
            seed=seed, warm_start_steps=WARM_START_STEPS, cache_dir=demo.toy_policy_cache, operators=(TASK_A, TASK_B)
        )
        initial = os.path.join(seed_dir, "initial_policy")
        model.save_pretrained(initial)  # every run of this seed starts from these exact weights
        tokenizer.save_pretrained(initial)
        common = {"seed": seed, "num_prompts": demo.num_prompts, "num_samples": demo.num_samples, "steps": 0}
        start_dir = os.path.join(seed_dir, "start")
        jobs.append(Job("start", 0, method="grpo", settings={}, model_path=initial, output_dir=start_dir, **common))
        for name, (method, values) in settings.items():
            phase1_dir, phase2_dir = (os.path.join(seed_dir, name, f"phase{phase}") for phase in (1, 2))
            first = Job(
                name,
                1,
                method=method,
                settings=values,
                model_path=initial,
                output_dir=phase1_dir,
                **dict(common, steps=demo.max_steps),
            )
            jobs.append(first)
            if demo.phase2_steps:
                after[first.key] = Job(
                    name,
                    2,
                    method="grpo",
                    settings=grpo_settings,
                    model_path=first.policy_path,
                    output_dir=phase2_dir,
                    **dict(common, steps=demo.phase2_steps),
                )
    jobs.sort(key=lambda job: job.phase == 0)  # the long runs first; the evaluations of the start fill in
    start_time, start_cpu = time.perf_counter(), cpu_seconds()
    results = execute(jobs, after, demo.workers, demo.output_dir)
    total_time, total_cpu = time.perf_counter() - start_time, cpu_seconds() - start_cpu

    def result(seed, name, phase):
        return results.get(f"seed {seed} / {name} / phase {phase}")

    per_seed = {
        name: [summarise(result(seed, name, 1), result(seed, name, 2), demo.smoothing) for seed in seeds]
        for name in demo.methods
    }
    initial = {str(seed): result(seed, "start", 0) for seed in seeds}
    history_path = os.path.join(demo.output_dir, "history.json")
    with open(history_path, "w") as file:
        json.dump(
            {
                "arguments": vars(demo),
                "versions": provenance,
                "total_wall_time_s": total_time,
                "total_cpu_time_s": total_cpu,
                "training": TOY_TRAINING_DEFAULTS,
                "warm_start_steps": WARM_START_STEPS,
                "runs": {name: {"method": method, "settings": values} for name, (method, values) in settings.items()},
                "initial_policy": {
                    "pass_at_k_task_a": initial_pass_at_k(initial),
                    "pass_at_1_task_b": _mean([run["pass_at_k"][TASK_B]["1"] for run in initial.values()]),
                },
                "summaries": {name: average(runs) for name, runs in per_seed.items()},
                "per_seed": {name: dict(zip(map(str, seeds), runs)) for name, runs in per_seed.items()},
                "histories": {name: result(seeds[0], name, 1)["history"] for name in demo.methods},
                "phase2_histories": {
                    name: result(seeds[0], name, 2)["history"] for name in demo.methods if demo.phase2_steps
                },
                # Every job's result, the held-out problems' correct counts included: write_outputs reads only these.
                "initial_evaluations": initial,
                "all_seeds": {
                    str(seed): {
                        name: {phase: result(seed, name, phase) for phase in (1, 2) if result(seed, name, phase)}
                        for name in demo.methods
                    }
                    for seed in seeds
                },
            },
            file,
            indent=1,
        )
    return write_outputs(history_path)


def initial_pass_at_k(initial: dict[str, dict]) -> dict[int, float]:
    """The start policy's held-out task-A pass@k, the mean over seeds."""
    first = next(iter(initial.values()))
    return {
        int(k): _mean([run["pass_at_k"][TASK_A][k] for run in initial.values()]) for k in first["pass_at_k"][TASK_A]
    }


def load_history(path: str) -> dict:
    """A saved history.json, checked to hold what the tables are computed from."""
    with open(path) as file:
        history = json.load(file)
    runs = [
        run for seed in history.get("all_seeds", {}).values() for phases in seed.values() for run in phases.values()
    ]
    if "initial_evaluations" not in history or not runs or any("correct" not in run for run in runs):
        raise ValueError(
            f"{path} does not hold each held-out problem's correct count (written by an older demo): run the demo "
            "again to get the tables with intervals"
        )
    return history


def write_outputs(history_path: str) -> dict[str, dict]:
    """Compute the tables from a saved history.json (no training), print them, and write table.md and
    entropy_collapse.png beside it; returns each run's summary (means over seeds). ``--from_history`` calls this."""
    history = load_history(history_path)
    output_dir = os.path.dirname(os.path.abspath(history_path))
    arguments = history["arguments"]
    num_samples, smoothing, phase2_steps = arguments["num_samples"], arguments["smoothing"], arguments["phase2_steps"]
    seeds = list(history["all_seeds"])
    names = list(history["runs"])
    runs = {name: [history["all_seeds"][seed][name] for seed in seeds] for name in names}
    summaries = {
        name: average([summarise(phases["1"], phases.get("2"), smoothing) for phases in runs[name]]) for name in names
    }
    start = initial_pass_at_k(history["initial_evaluations"])
    start_b = _mean([run["pass_at_k"][TASK_B]["1"] for run in history["initial_evaluations"].values()])
    intervals = interval_summaries(runs, num_samples, smoothing)
    interval_text = [
        format_interval_table(intervals, phase1_interval_columns(num_samples), len(seeds)),
    ]
    tables = [format_markdown_table(summaries, phase1_columns(num_samples))]
    if phase2_steps:
        interval_text.append(format_interval_table(intervals, PHASE2_INTERVAL_COLUMNS, len(seeds), suffix="→B"))
        tables.append(format_markdown_table(summaries, phase2_columns(len(seeds)), suffix="→B"))
    scope = interval_scope(len(seeds))
    with open(os.path.join(output_dir, "table.md"), "w") as file:
        file.write(
            f"Means and 95 % intervals ({scope}):\n\n"
            + "\n\n".join(interval_text)
            + "\n\nEvery number, means over seeds:\n\n"
            + "\n\n".join(tables)
            + "\n"
        )
    print()
    print(
        f"Phase 1, task A (addition); the start policy: pass@1 {start[1]:.3f}, "
        f"pass@{num_samples} {start[num_samples]:.3f}"
    )
    print(format_table(summaries, phase1_columns(num_samples)))
    if phase2_steps:
        print(f"\nPhase 2, plain GRPO on task B (subtraction); the start policy's B pass@1: {start_b:.3f}")
        print(format_table(summaries, phase2_columns(len(seeds)), suffix="→B"))
    print(f"\nMeans and 95 % intervals ({scope}):\n")
    print("\n\n".join(interval_text))
    # The picture last: the tables are out even if drawing fails.
    png = os.path.join(output_dir, "entropy_collapse.png")
    seed_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}–{seeds[-1]} (mean)"
    title = (
        f"Toy task, {arguments['num_prompts']} prompts per task, {arguments['max_steps']} + {phase2_steps} steps, "
        f"{seed_text}, " + ("library defaults" if arguments["paper_defaults"] else "settings of examples/configs")
    )
    phase1 = {name: [phases["1"]["history"] for phases in runs[name]] for name in names}
    phase2 = {name: [phases["2"]["history"] for phases in runs[name]] for name in names} if phase2_steps else {}
    plot(phase1, phase2, summaries, start, png, smoothing, title)
    print(f"\nCurves: {png}")
    print(
        f"Total: {history['total_wall_time_s']:.0f} s wall, {history['total_cpu_time_s']:.0f} s of CPU time over "
        f"{arguments['workers']} worker(s); numeric path: {history['versions'].get('aten_cpu_capability')}"
    )
    if any(not math.isfinite(summary["final_entropy"]) for summary in summaries.values()):
        raise RuntimeError("a run ended with a non-finite entropy")
    return summaries


if __name__ == "__main__":
    hide_known_upstream_noise()
    (demo_arguments,) = TrlParser((DemoArguments,)).parse_args_and_config()
    if demo_arguments.worker:
        serve_jobs()
    elif demo_arguments.from_history:
        write_outputs(demo_arguments.from_history)
    else:
        main(demo_arguments)
