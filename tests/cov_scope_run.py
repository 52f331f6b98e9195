"""Clip-Cov and KL-Cov trained under both ``cov_selection_scope`` values, by ``accelerate launch`` or one process.

    accelerate launch --cpu --num_processes 2 tests/cov_scope_run.py --model PATH --out DIR --per-device-batch-size 4
    python tests/cov_scope_run.py --model PATH --out DIR --per-device-batch-size 8

Completions come from ``distributed_run.deterministic_rollout``, so every layout of the same global batch sees the
same completions. Every rank writes ``<method>_<scope>_rank<k>.pt`` with the record of :func:`train_recording`.
tests/test_cov.py imports :func:`train_recording` for the layouts inside one process.

The runs use plain SGD, so that a difference in the weights is proportional to a difference in the gradients: Adam's
first updates are sign-like, and turn rounding noise in a near-zero gradient entry into a step of the full learning
rate. Four steps with ``num_iterations=2`` (KL-Cov) make two off-policy passes, where KL-Cov's penalty acts.
"""

import argparse
import os
import sys

import torch
from distributed_run import logged, make_trainer

from trl_entropy.cov import COV_SELECTION_KEY, COV_SELECTION_SCOPES


METHODS = ("clip_cov", "kl_cov")
FRACTION = {"clip_cov": "clip_cov/detached_fraction", "kl_cov": "kl_cov/penalised_fraction"}
STEPS = 4
# Shared by every layout. KL-Cov penalises a tenth of the tokens, so that its selection visibly moves the weights.
TRAINING = {"optim": "sgd", "learning_rate": 0.1, "max_steps": STEPS}
METHOD_OPTIONS = {"clip_cov": {}, "kl_cov": {"kl_cov_ratio": 0.1}}


def train_recording(method: str, model: str, output_dir: str, scope: str, **overrides) -> dict:
    """Train ``method`` on the toy task (``TRAINING``, ``METHOD_OPTIONS``, then ``overrides``) with
    ``cov_selection_scope=scope`` and return what the comparisons need.

    ``selection``: per generation batch, this rank's rows in order, each ``(valid completion token ids, selected
    positions among them)`` (empty under the micro-batch scope, which selects in the loss); ``weights``: the final
    parameters, flat, float64; ``fraction`` and ``loss``: logged per step; ``num_processes``.
    """
    options = {**TRAINING, **METHOD_OPTIONS[method], **overrides}
    trainer = make_trainer(method, model, output_dir, cov_selection_scope=scope, **options)
    selection = []
    generate = trainer._generate_and_score_completions

    def generate_and_record(inputs):
        output = generate(inputs)
        if COV_SELECTION_KEY in output:
            rows = zip(output["completion_ids"], output["completion_mask"].bool(), output[COV_SELECTION_KEY])
            selection.append(
                [(ids[valid].tolist(), chosen[valid].nonzero().flatten().tolist()) for ids, valid, chosen in rows]
            )
        return output

    trainer._generate_and_score_completions = generate_and_record
    trainer.train()
    return {
        "selection": selection,
        "weights": torch.cat([p.detach().flatten().double() for p in trainer.model.parameters()]),
        "fraction": logged(trainer, FRACTION[method]),
        "loss": logged(trainer, "loss"),
        "num_processes": trainer.accelerator.num_processes,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="path of a saved toy policy")
    parser.add_argument("--out", required=True, help="folder for the per-rank records")
    parser.add_argument("--per-device-batch-size", type=int, required=True)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1)
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    os.makedirs(options.out, exist_ok=True)
    for method in METHODS:
        for scope in COV_SELECTION_SCOPES:
            record = train_recording(
                method,
                options.model,
                os.path.join(options.out, f"{method}_{scope}"),
                scope,
                per_device_train_batch_size=options.per_device_batch_size,
                gradient_accumulation_steps=options.gradient_accumulation_steps,
            )
            rank = int(os.environ.get("RANK", 0))
            torch.save(record, os.path.join(options.out, f"{method}_{scope}_rank{rank}.pt"))


if __name__ == "__main__":
    sys.exit(main())
