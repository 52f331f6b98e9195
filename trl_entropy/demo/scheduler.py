"""Running the demo's jobs: in this process (one worker) or in worker processes that stay up and take one job after
another (:mod:`trl_entropy.demo.worker`), with a progress bar over the optimizer steps. A job that trains with vLLM
runs in a worker process started for it alone (``Job.own_process``)."""

import json
import os
import queue
import socket
import subprocess
import sys
import threading
from dataclasses import asdict
from pathlib import Path

from .jobs import Job, run_job
from .models import TASK_A, TASK_B


def engine_port(taken: set[int], ports: range = range(29500, 32768)) -> int:
    """A free port of ``ports`` not in ``taken`` (the ports other engines were given), added to ``taken``; the default
    range lies below Linux's ephemeral range, where no outgoing connection takes a port. TRL's colocate mode starts
    vLLM's process group on ``MASTER_PORT``, or else on the first of a few fixed ports that is free when it looks: two
    engines starting at once would both take 29500."""
    for port in ports:
        if port in taken:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("localhost", port))
            except OSError:
                continue
        taken.add(port)
        return port
    raise RuntimeError(f"no free port in {ports.start}..{ports.stop - 1} for a vLLM engine")


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
        if job.phase or TASK_B not in result["pass_at_k"]:
            line += f", task-A pass@1 {result['pass_at_k'][TASK_A]['1']:.3f}"
        if TASK_B in result["pass_at_k"]:
            line += f", task-B pass@1 {result['pass_at_k'][TASK_B]['1']:.3f}"
        bar.write(line)

    pending = list(jobs)
    if workers == 1 and not any(job.own_process for job in [*jobs, *after.values()]):
        while pending:
            job = pending.pop(0)
            finish(job, run_job(job, report=lambda: bar.update(1)))
            if job.key in after:
                pending.insert(0, after[job.key])
        bar.close()
        return results

    # Worker processes stay up and take one job after another (a job file's path on their stdin), so the imports are
    # paid once per worker; each prints "step" per optimizer step and "done" per job. After a job that needs a process
    # of its own, its worker is told to exit (its stdin closed), and a fresh one takes its slot's next job.
    events: queue.Queue = queue.Queue()
    log_dir = os.path.join(output_dir, "logs")
    os.makedirs(log_dir, exist_ok=True)
    # The workers import the same trl_entropy as this process, wherever it was imported from.
    package_root = str(Path(__file__).resolve().parents[2])
    python_path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=python_path)
    # vLLM's CPU build otherwise sizes its KV cache from the machine's memory (gigabytes per engine); a generation
    # batch of the demo fills a few megabytes of it.
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    processes: list[subprocess.Popen] = []
    retired: list[subprocess.Popen] = []  # told to exit
    ports: set[int] = set()  # MASTER_PORT of each worker started, a port of its own
    assigned: dict[int, Job] = {}

    def watch(index: int, process: subprocess.Popen) -> None:
        for line in process.stdout:
            if line.strip() in ("step", "done"):
                events.put((line.strip(), index, process))
        events.put(("exit", index, process))

    def start(index: int) -> None:
        """Start the worker of slot ``index`` (its log appended to, after the slot's first worker)."""
        mode = "w" if index == len(processes) else "a"
        with open(os.path.join(log_dir, f"worker{index}.txt"), mode) as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "trl_entropy.demo.worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=dict(env, MASTER_PORT=str(engine_port(ports))),
            )
        if index == len(processes):
            processes.append(process)
        else:
            processes[index] = process
        threading.Thread(target=watch, args=(index, process), daemon=True).start()

    for index in range(min(workers, len(jobs))):
        start(index)
    idle = list(range(len(processes)))
    try:
        while pending or assigned:
            while pending and idle:
                index, job = idle.pop(0), pending.pop(0)
                if processes[index] in retired:
                    start(index)
                os.makedirs(job.output_dir, exist_ok=True)
                with open(job.job_path, "w") as file:
                    json.dump(asdict(job), file)
                processes[index].stdin.write(job.job_path + "\n")
                processes[index].stdin.flush()
                assigned[index] = job
            kind, index, process = events.get()
            if kind == "step":
                bar.update(1)
            elif kind == "exit" and process in retired:  # a worker told to exit after its job
                continue
            elif kind == "exit":  # a worker only exits by itself when a job fails
                with open(os.path.join(log_dir, f"worker{index}.txt")) as log:
                    tail = log.read()[-3000:]
                job = assigned.get(index)
                raise RuntimeError(
                    f"{job.key if job else 'a worker'} failed (exit code {process.wait()}); its log ends:\n{tail}"
                )
            else:
                job = assigned.pop(index)
                if job.own_process:
                    retired.append(process)
                    process.stdin.close()
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
        for process in {*processes, *retired}:
            process.wait()
    return results
