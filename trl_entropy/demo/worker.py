"""A worker process of the demo (``python -m trl_entropy.demo.worker``): runs each job whose file path arrives on
stdin, one per line, until stdin closes; prints ``step`` per optimizer step and ``done`` per job, and to its log
(stderr) its process id and each job's key as the job starts."""

import json
import os
import sys

from trl_entropy.core.trl.noise import hide_known_upstream_noise

from .jobs import Job, run_job


def serve_jobs() -> None:
    """The worker's side: run each job whose file path arrives on stdin, one per line, until stdin closes."""
    for line in sys.stdin:
        with open(line.strip()) as file:
            job = Job(**json.load(file))
        print(f"[demo worker {os.getpid()}] {job.key}", file=sys.stderr, flush=True)  # the log says who ran what
        result = run_job(job, report=lambda: print("step", flush=True))
        with open(job.result_path + ".tmp", "w") as file:
            json.dump(result, file)
        os.replace(job.result_path + ".tmp", job.result_path)
        print("done", flush=True)


if __name__ == "__main__":
    hide_known_upstream_noise()
    serve_jobs()
