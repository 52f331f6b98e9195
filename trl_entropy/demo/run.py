"""The whole demo: the jobs of every seed and run (:func:`run_demo`), history.json, and the tables and figure
computed from it (:func:`write_outputs`, also ``--from_history``)."""

import json
import math
import os
import time

from trl_entropy.report import missing_matplotlib

from .arguments import DemoArguments, run_settings
from .figure import plot
from .jobs import Job
from .models import CONFIGS_DIR, DEMO_MODELS, TASK_A, TASK_B
from .provenance import cpu_seconds, versions
from .scheduler import execute
from .summary import along_training, average, interval_scope, interval_summaries, mean, pooled_law, summarise
from .tables import (
    PHASE2_INTERVAL_COLUMNS,
    format_along_training_table,
    format_interval_table,
    format_markdown_table,
    format_table,
    phase1_columns,
    phase1_interval_columns,
    phase2_columns,
)


def run_demo(demo: DemoArguments) -> dict[str, dict]:
    """Run every job (each seed's start policy, each run's phases), write history.json, then the tables and the
    figures (:func:`write_outputs`); returns each run's summary (means over seeds)."""
    import torch

    problem = missing_matplotlib("the demo draws its curves")
    if problem:  # before any training
        raise ImportError(problem)
    settings = {name: run_settings(name, demo) for name in demo.methods}  # fail before any training on a bad run
    provenance = versions()
    os.makedirs(demo.output_dir, exist_ok=True)
    model = DEMO_MODELS[demo.model]
    seeds = [demo.seed + offset for offset in range(demo.num_seeds)]
    jobs, after = [], {}
    grpo_settings = run_settings("grpo", demo)[1]
    # The real model shares torch's threads (its default, or OMP_NUM_THREADS) among the workers; the toy uses one (more
    # only add overhead on a model that small).
    threads = max(1, torch.get_num_threads() // demo.workers) if model.pretrained else 1
    for seed in seeds:
        seed_dir = os.path.join(demo.output_dir, f"seed{seed}")
        cache_dir = demo.model_cache_dir if model.pretrained else demo.toy_policy_cache
        initial = model.start_policy(seed, seed_dir, cache_dir)
        common = {
            "seed": seed,
            "num_prompts": demo.num_prompts,
            "num_samples": demo.num_samples,
            "steps": 0,
            "model": demo.model,
            "threads": threads,
        }
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
                **dict(common, steps=demo.max_steps, eval_steps=demo.eval_steps, generator=demo.generator),
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
                # What sampled the training completions (the held-out pass@k is transformers' generate either way).
                "generator": demo.generator,
                "training": model.training,
                **model.provenance(),
                "runs": {name: {"method": method, "settings": values} for name, (method, values) in settings.items()},
                "initial_policy": {"pass_at_k_task_a": initial_pass_at_k(initial)}
                | (
                    {"pass_at_1_task_b": mean([run["pass_at_k"][TASK_B]["1"] for run in initial.values()])}
                    if TASK_B in model.tasks
                    else {}
                ),
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
        int(k): mean([run["pass_at_k"][TASK_A][k] for run in initial.values()]) for k in first["pass_at_k"][TASK_A]
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
    entropy_collapse.png beside it, and for a pretrained model each seed's ``trl-entropy report`` (report.png and
    report.md in its folder); returns each run's summary (means over seeds). ``--from_history`` calls this."""
    history = load_history(history_path)
    output_dir = os.path.dirname(os.path.abspath(history_path))
    arguments = history["arguments"]
    model = DEMO_MODELS[arguments.get("model", "toy")]
    num_samples, smoothing, phase2_steps = arguments["num_samples"], arguments["smoothing"], arguments["phase2_steps"]
    seeds = list(history["all_seeds"])
    names = list(history["runs"])
    runs = {name: [history["all_seeds"][seed][name] for seed in seeds] for name in names}
    summaries = {
        name: average([summarise(phases["1"], phases.get("2"), smoothing) for phases in runs[name]]) for name in names
    }
    start = initial_pass_at_k(history["initial_evaluations"])
    num_held_out = len(next(iter(history["initial_evaluations"].values()))["correct"][TASK_A])
    intervals = interval_summaries(runs, num_samples, smoothing)
    interval_text = [
        format_interval_table(intervals, phase1_interval_columns(num_samples), len(seeds)),
    ]
    tables = [format_markdown_table(summaries, phase1_columns(num_samples))]
    if phase2_steps:
        interval_text.append(format_interval_table(intervals, PHASE2_INTERVAL_COLUMNS, len(seeds), suffix="→B"))
        tables.append(format_markdown_table(summaries, phase2_columns(len(seeds)), suffix="→B"))
    scope = interval_scope(len(seeds), num_held_out)
    along = along_training(history["initial_evaluations"], runs, num_samples, arguments["max_steps"])
    extra = []
    if along:
        extra.append(
            f"Held-out pass@k along training (the start policy at step 0; means and 95 % intervals, {scope}):\n\n"
            + format_along_training_table(along, num_samples)
        )
    if model.pretrained:
        extra.append(pooled_law(runs))
    with open(os.path.join(output_dir, "table.md"), "w") as file:
        file.write(
            f"Means and 95 % intervals ({scope}):\n\n"
            + "\n\n".join(interval_text)
            + "\n\nEvery number, means over seeds:\n\n"
            + "\n\n".join(tables)
            + "".join(f"\n\n{text}" for text in extra)
            + "\n"
        )
    print()
    print(
        f"Phase 1, {model.task_label(TASK_A)}; the start policy: pass@1 {start[1]:.3f}, "
        f"pass@{num_samples} {start[num_samples]:.3f}"
    )
    print(format_table(summaries, phase1_columns(num_samples)))
    if phase2_steps:
        start_b = mean([run["pass_at_k"][TASK_B]["1"] for run in history["initial_evaluations"].values()])
        print(f"\nPhase 2, plain GRPO on task B (subtraction); the start policy's B pass@1: {start_b:.3f}")
        print(format_table(summaries, phase2_columns(len(seeds)), suffix="→B"))
    print(f"\nMeans and 95 % intervals ({scope}):\n")
    print("\n\n".join(interval_text))
    for text in extra:
        print(f"\n{text}")
    # The pictures last: the tables are out even if drawing fails.
    png = os.path.join(output_dir, "entropy_collapse.png")
    seed_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}–{seeds[-1]} (mean)"
    steps_text = (
        f"{arguments['max_steps']} + {phase2_steps} steps" if phase2_steps else f"{arguments['max_steps']} steps"
    )
    configs = f"settings of {model.configs_dir.relative_to(CONFIGS_DIR.parents[2])}"  # the same, installed or cloned
    title = f"{model.title}, {arguments['num_prompts']} prompts per task, {steps_text}, {seed_text}, " + (
        "library defaults" if arguments["paper_defaults"] or arguments.get("configs_dir", "") is None else configs
    )
    phase1 = {name: [phases["1"]["history"] for phases in runs[name]] for name in names}
    phase2 = {name: [phases["2"]["history"] for phases in runs[name]] for name in names} if phase2_steps else {}
    plot(phase1, phase2, summaries, start, png, smoothing, title, model.labels(num_held_out), along)
    print(f"\nCurves: {png}")
    if model.pretrained:  # the project's own report of each seed's runs: controllers, the law, pass@k along training
        from trl_entropy.report import write_report

        for seed in seeds:
            report = write_report(os.path.join(output_dir, f"seed{seed}"))
            print(f"Report of seed {seed}: {report.png} ({len(report.panels)} panels)")
    print(
        f"Total: {history['total_wall_time_s']:.0f} s wall, {history['total_cpu_time_s']:.0f} s of CPU time over "
        f"{arguments['workers']} worker(s); numeric path: {history['versions'].get('aten_cpu_capability')}"
    )
    if any(not math.isfinite(summary["final_entropy"]) for summary in summaries.values()):
        raise RuntimeError("a run ended with a non-finite entropy")
    return summaries
