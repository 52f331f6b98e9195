"""From the jobs' results to the demo's numbers: each run's curves and summary (means over seeds), and the
intervals of the two-level bootstrap with each difference to GRPO."""

import math
from dataclasses import replace

import numpy as np

from trl_entropy.report.runlog import moving_average

from .arguments import FULL_SEEDS
from .models import TASK_A, TASK_B


def curves(history: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """(steps, values) of the entropy and of the reward. With num_iterations > 1 only the steps that generated
    completions log a reward."""
    steps = list(range(1, len(history) + 1))
    rewarded = [(step, entry["reward"]) for step, entry in zip(steps, history) if "reward" in entry]
    return {
        "entropy": (steps, [entry["entropy"] for entry in history]),
        "reward": ([step for step, _ in rewarded], [value for _, value in rewarded]),
    }


def mean(values: list[float]) -> float:
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
        "initial_reward": mean(reward[:tenth]),
        "final_reward": mean(reward[-tenth:]),
        "held_out_success": phase1["pass_at_k"][TASK_A]["1"],
        "pass_at_k": {int(k): value for k, value in phase1["pass_at_k"][TASK_A].items()},
        "law_a": law.get("law_a", math.nan),
        "law_b": law.get("law_b", math.nan),
        "law_ceiling": law.get("predicted_ceiling", math.nan),
        "wall_time_s": phase1["wall_time_s"],
        "cpu_time_s": phase1["cpu_time_s"],
    }
    if TASK_B in phase1["pass_at_k"]:
        summary["b_start"] = phase1["pass_at_k"][TASK_B]["1"]
    if phase2 is not None:
        b_reward = curves(phase2["history"])["reward"][1]
        b_tenth = max(1, len(b_reward) // 10)
        summary |= {
            "b_initial_reward": mean(b_reward[:b_tenth]),
            "b_final_reward": mean(b_reward[-b_tenth:]),
            "b_end": phase2["pass_at_k"][TASK_B]["1"],
            "phase2_gain": mean(b_reward[-b_tenth:]) - mean(b_reward[:b_tenth]),
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
            averaged[key] = {k: mean([summary[key][k] for summary in per_seed]) for k in value}
        else:
            averaged[key] = mean([summary[key] for summary in per_seed])
    if "phase2_gain" in averaged:
        averaged["phase2_gains"] = [summary["phase2_gain"] for summary in per_seed]
        averaged["b_ends"] = [summary["b_end"] for summary in per_seed]
    return averaged


# The run every other is compared with: each interval table shows the difference to it.
BASELINE = "grpo"


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


def interval_scope(num_seeds: int, num_held_out: int) -> str:
    """What the intervals resample, and which claims need --full."""
    if num_seeds == 1:
        return (
            f"one seed: the intervals resample the {num_held_out} held-out problems only, not the seed-to-seed "
            "spread, and per-run numbers (entropy, training reward, phase-2 gain) have none; whether a method differs "
            f"from GRPO needs --full ({FULL_SEEDS} seeds)"
        )
    return (
        f"two-level bootstrap over the {num_seeds} seeds and, within each, the {num_held_out} held-out problems; each "
        "difference to GRPO paired (the same seeds and problems resampled for both)"
    )


def along_training(
    initial: dict[str, dict], runs: dict[str, list[dict]], num_samples: int, max_steps: int
) -> dict[str, dict]:
    """Held-out pass@1 and pass@``num_samples`` of each run at each step it was evaluated (the start policy at step
    0, the evaluations along training, step ``max_steps``), ``{run: {step: {k: Interval}}}``: means over seeds and
    held-out problems with their bootstrap intervals. Empty when no run was evaluated along training."""
    from trl_entropy.evaluation import bootstrap_mean, pass_at_k

    if not any(phases["1"].get("evaluations") for seeds in runs.values() for phases in seeds):
        return {}
    start = [np.asarray(run["correct"][TASK_A]) for run in initial.values()]
    table = {}
    for name, seeds in runs.items():
        counts = {0: start}
        for phases in seeds:
            phase1 = phases["1"]
            points = [*phase1["evaluations"], {"step": max_steps, "correct": phase1["correct"][TASK_A]}]
            for point in points:
                counts.setdefault(point["step"], []).append(np.asarray(point["correct"]))
        table[name] = {
            step: {
                k: bootstrap_mean(np.stack([pass_at_k(num_samples, seed, k) for seed in per_seed]))
                for k in sorted({1, num_samples})
            }
            for step, per_seed in sorted(counts.items())
        }
    return table


def pooled_law(runs: dict[str, list[dict]]) -> str:
    """The entropy–reward law fitted on the logged (entropy, reward) pairs of every phase-1 run and seed together, as
    a sentence with its R² (or why it is not fitted)."""
    from trl_entropy.evaluation import entropy_law_fit

    pairs = [
        (entry["entropy"], entry["reward"])
        for seeds in runs.values()
        for phases in seeds
        for entry in phases["1"]["history"]
        if "reward" in entry
    ]
    fit = entropy_law_fit([h for h, _ in pairs], [r for _, r in pairs])
    if fit.law is None:
        return f"The entropy–reward law R = −a·exp(H) + b on every run's steps pooled: not fitted ({fit.reason})."
    r_squared = "–" if fit.r_squared is None else f"{fit.r_squared:.3f}"
    return (
        f"The entropy–reward law R = −a·exp(H) + b on every run's steps pooled ({fit.num_pairs} steps): "
        f"a = {fit.law.a:.4f}, b = {fit.law.b:.4f}, ceiling b − a = {fit.law.ceiling:.3f}, R² = {r_squared}."
    )
