"""One job of the demo: train (or not) one policy on one task, then evaluate it on the held-out problems of every
task of its model; its result is a dict of plain values (what the worker processes write as JSON)."""

import contextlib
import os
import time
from dataclasses import dataclass

from transformers import GenerationConfig, PrinterCallback, ProcessorMixin, Trainer, TrainerCallback

from trl_entropy.methods import get_method

from .models import DEMO_MODELS, TASK_A, TASK_B, TASK_NAMES, VLLM_TRAINING_SETTINGS


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
    model: str = "toy"  # a key of DEMO_MODELS
    eval_steps: int | None = None  # held-out evaluations along training, every this many steps
    threads: int = 1  # torch's threads in the job's process
    generator: str = "transformers"  # what samples the training completions: "transformers" or "vllm"

    @property
    def own_process(self) -> bool:
        """Whether the job needs a fresh process: one vLLM engine per process, what TRL's colocate mode is made for
        (it starts the engine's process group inside the training process)."""
        return self.generator == "vllm"

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


def evaluate(trainer, job: Job, operator: str) -> tuple[list[int], dict[str, float]]:
    """Each held-out problem's correct count out of ``job.num_samples`` samples of the trainer's current policy, in
    the held-out set's order (what the intervals resample), and pass@k for k = 1, 2, 4 ... ``num_samples``. Every
    evaluation of a job draws its samples from the job's seed."""
    from trl_entropy.evaluation import count_correct, pass_at_k, pass_at_k_values

    held_out = DEMO_MODELS[job.model].held_out_set(operator)
    with transformers_sampling(trainer):
        counts = count_correct(trainer, held_out, job.num_samples, prompts_per_batch=len(held_out), seed=job.seed)
    values = {str(k): float(pass_at_k(job.num_samples, counts, k).mean()) for k in pass_at_k_values(job.num_samples)}
    return counts.tolist(), values


@contextlib.contextmanager
def transformers_sampling(trainer):
    """While open, ``trainer`` samples with transformers' ``generate`` even where vLLM samples its training
    completions, with the settings TRL gives ``generate`` when it trains without vLLM: a policy's pass@k is then
    measured alike whatever generated its training batches (vLLM's CPU build computes in bf16, so its samples follow
    slightly other probabilities)."""
    if not trainer.use_vllm:
        yield
        return
    processing_class = trainer.processing_class
    tokenizer = processing_class.tokenizer if isinstance(processing_class, ProcessorMixin) else processing_class
    trainer.generation_kwargs = {
        "max_new_tokens": trainer.max_completion_length,
        "do_sample": True,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": trainer.eos_token_ids,
        "temperature": trainer.temperature,
        "top_p": trainer.top_p,
        "top_k": trainer.top_k,
        "min_p": trainer.min_p,
        "repetition_penalty": trainer.repetition_penalty,
        "cache_implementation": trainer.args.cache_implementation,
        **(trainer.args.generation_kwargs or {}),
    }
    trainer.generation_config = GenerationConfig(**trainer.generation_kwargs, disable_compile=True)
    trainer.use_vllm = False
    try:
        yield
    finally:
        trainer.use_vllm = True
        del trainer.generation_kwargs, trainer.generation_config


class HeldOutEvaluation(TrainerCallback):
    """Every ``job.eval_steps`` optimizer steps before the last (the job evaluates after training anyway): pass@k on
    the held-out problems of the task trained on, logged as ``eval/pass@k`` at that step (as
    :class:`trl_entropy.PassAtKCallback` logs it, without TRL's own evaluation loop) and kept in ``evaluations``."""

    def __init__(self, trainer, job: Job, operator: str):
        self.trainer, self.job, self.operator = trainer, job, operator
        self.evaluations: list[dict] = []

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.job.eval_steps or state.global_step >= state.max_steps:
            return
        correct, values = evaluate(self.trainer, self.job, self.operator)
        self.evaluations.append({"step": state.global_step, "correct": correct, "pass_at_k": values})
        should_log = control.should_log
        # Trainer.log, not the GRPO trainer's override: that one would also flush the metrics it is accumulating.
        Trainer.log(self.trainer, {f"eval/pass@{k}": value for k, value in values.items()})
        control.should_log = should_log  # Trainer.log clears it, and the step's own training log is still to come


def run_job(job: Job, report=lambda: None) -> dict:
    """Train and evaluate one job in this process; returns its log, pass@k on every task (and along training, with
    ``eval_steps``), law fit and timings."""
    import torch

    from trl_entropy.evaluation import EntropyLawCallback

    # One thread for the toy (it is tiny: more only add overhead); the real model's share of the cores otherwise.
    torch.set_num_threads(job.threads)
    model = DEMO_MODELS[job.model]
    method = get_method(job.method)
    batch = model.training["per_device_train_batch_size"]
    training = dict(model.training, max_steps=max(job.steps, 1), logging_steps=1, disable_tqdm=True)
    values = {**training, **method.defaults, **job.settings}  # the run's config overrides the registry defaults
    if job.generator == "vllm":
        values |= VLLM_TRAINING_SETTINGS
    args = method.config_class(output_dir=job.output_dir, seed=job.seed, **values)
    operator = TASK_B if job.phase == 2 else TASK_A
    tokenizer = model.tokenizer(job.model_path)
    trainer = method.trainer_class(
        model=job.model_path,
        reward_funcs=model.reward(),
        args=args,
        train_dataset=model.training_set(operator, job.num_prompts, max(job.steps, 1) * batch, job.seed),
        processing_class=tokenizer,
    )
    trainer.remove_callback(PrinterCallback)  # no line per step: the demo prints one summary per run
    trainer.add_callback(EntropyLawCallback(trainer))
    along = HeldOutEvaluation(trainer, job, operator)
    if job.eval_steps is not None and job.steps > 0:
        trainer.add_callback(along)
    trainer.add_callback(StepReporter(report))
    wall_start, cpu_start = time.perf_counter(), time.process_time()
    if job.steps > 0:
        trainer.train()
    wall_time, cpu_time = time.perf_counter() - wall_start, time.process_time() - cpu_start
    correct, pass_at = {}, {}
    for task in model.tasks:
        correct[task], pass_at[task] = evaluate(trainer, job, task)
    if job.phase == 1 and len(model.tasks) > 1:  # phase 2 starts from it
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
        # The evaluations along training (eval_steps), before the last step's (pass_at_k), on the task trained on.
        "evaluations": along.evaluations,
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
    for task in pass_at:
        if task != trained:
            entry |= {f"eval/{TASK_NAMES[task]}/pass@{k}": value for k, value in pass_at[task].items()}
    trainer.state.log_history.append({**entry, "step": trainer.state.global_step})
    trainer.state.save_to_json(os.path.join(job.output_dir, "trainer_state.json"))
