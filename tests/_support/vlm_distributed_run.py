"""A short training run of trainers on a tiny vision-language model, for ``accelerate launch`` and a plain process.

    CUDA_VISIBLE_DEVICES= accelerate launch --multi_gpu --num_processes 2 tests/_support/vlm_distributed_run.py \
        --family qwen2_vl --out DIR/two --per-device-batch-size 4 --methods grpo
    python tests/_support/vlm_distributed_run.py --family qwen2_vl --out DIR/one --per-device-batch-size 8 \
        --methods grpo

Every process builds the same tiny VLM (``_support/vlm.py``, seeded) and trains each of ``--methods`` on the
image-question dataset, with completions from ``vlm.vlm_rollout`` (a fixed function of the image and the copy index:
two processes and one see the same completions). Every rank writes ``<method>_rank<k>.json`` (the logged loss,
entropy and reward, the controller value after each step) and ``<method>_rank<k>.pt`` (the final weights).
"""

import argparse
import json
import os


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from _support.distributed_run import ControllerRecorder, end_rank_cleanly, full_weights, logged  # noqa: E402
from _support.process import lighten  # noqa: E402
from _support.vlm import build_vlm, vlm_rollout, vlm_trainer  # noqa: E402


def run(family: str, method: str, out: str, per_device_batch_size: int, steps: int) -> None:
    model, processor = build_vlm(family)
    trainer = vlm_trainer(
        method,
        model,
        processor,
        os.path.join(out, method),
        per_device_train_batch_size=per_device_batch_size,
        max_steps=steps,
        trainer_kwargs={"rollout_func": vlm_rollout},
    )
    recorder = ControllerRecorder.attached_to(trainer)
    trainer.train()
    rank = trainer.accelerator.process_index
    record = {
        "num_processes": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type.value),
        "controller": recorder.values,
        "statistics": recorder.statistics,
        "moved_by_method": recorder.moved_by_method,
        **{key: logged(trainer, key) for key in ("loss", "entropy", "reward", "grad_norm")},
    }
    os.makedirs(out, exist_ok=True)
    torch.save(full_weights(trainer.model), os.path.join(out, f"{method}_rank{rank}.pt"))
    with open(os.path.join(out, f"{method}_rank{rank}.json"), "w") as file:
        json.dump(record, file)
    trainer.accelerator.wait_for_everyone()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", required=True, help="a family of _support/vlm.py's FAMILIES")
    parser.add_argument("--out", required=True, help="folder for the per-rank records")
    parser.add_argument("--methods", required=True, help="comma-separated registry names")
    parser.add_argument("--per-device-batch-size", type=int, required=True)
    parser.add_argument("--steps", type=int, default=3)
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    lighten()
    for method in options.methods.split(","):
        run(options.family, method, options.out, options.per_device_batch_size, options.steps)


if __name__ == "__main__":
    main()
    end_rank_cleanly(int(os.environ.get("RANK", 0)))
