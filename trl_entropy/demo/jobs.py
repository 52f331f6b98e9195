"""One job of the demo: train (or not) one policy on one task, then evaluate it on the held-out problems of both
tasks; its result is a dict of plain values (what the worker processes write as JSON)."""

import os
import time
from dataclasses import dataclass

from transformers import PrinterCallback, TrainerCallback

from trl_entropy.methods import get_method
from trl_entropy.toy import TOY_TRAINING_DEFAULTS, toy_training_set

from .arguments import TASK_A, TASK_B, TASK_NAMES


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
