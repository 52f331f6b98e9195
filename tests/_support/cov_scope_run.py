"""Clip-Cov and KL-Cov trained under both ``cov_selection_scope`` values, by ``accelerate launch`` or one process.

    python tests/_support/cov_scope_run.py --model DIR/toy --out DIR/one --per-device-batch-size 8
    python tests/_support/cov_scope_run.py --model DIR/toy --out DIR/accumulated --per-device-batch-size 4 \
        --gradient-accumulation-steps 2
    CUDA_VISIBLE_DEVICES= accelerate launch --multi_gpu --num_processes 2 tests/_support/cov_scope_run.py \
        --model DIR/toy \
        --out DIR/two --per-device-batch-size 4
    python tests/_support/cov_scope_run.py --model DIR/toy --compare DIR/one DIR/accumulated DIR/two

Each layout holds 8 completions per generation batch. (``--multi_gpu`` only selects torchrun's launcher: without CUDA
each process uses the CPU and gloo; ``--cpu`` would start a single process.) Completions come from
``distributed_run.deterministic_rollout``, so every layout sees the same completions. Every rank writes
``<method>_<scope>_rank<k>.pt`` with the record of :func:`train_recording`; ``--compare`` prints, for each method and
scope, how far each layout's final weights lie from the first layout's (relative to the update,
:func:`update_difference`) and whether it selected the same tokens.
A missing ``--model`` folder is filled with the warm-started toy policy first (by a one-process run).
tests/methods/test_cov_selection.py imports :func:`train_recording`, :func:`load_records` and
:func:`update_difference`.

The runs use plain SGD, so that a difference in the weights is proportional to a difference in the gradients: Adam's
first updates are sign-like, and turn rounding noise in a near-zero gradient entry into a step of the full learning
rate. Four steps with ``num_iterations=2`` (KL-Cov) make two off-policy passes, where KL-Cov's penalty acts.
"""

import argparse
import os
import sys

import torch

from _support.distributed_run import logged, make_trainer
from _support.process import lighten
from trl_entropy.methods.cov_selection import COV_SELECTION_KEY, COV_SELECTION_SCOPES


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
    parameters, flat, float64; ``initial_weights``: the same before training; ``fraction`` and ``loss``: logged per
    step; ``num_processes``; ``layout``: processes × micro-batch × accumulation, in words.
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

    def flat_weights():
        return torch.cat([p.detach().flatten().double() for p in trainer.model.parameters()])

    trainer._generate_and_score_completions = generate_and_record
    initial_weights = flat_weights()
    trainer.train()
    return {
        "selection": selection,
        "weights": flat_weights(),
        "initial_weights": initial_weights,
        "fraction": logged(trainer, FRACTION[method]),
        "loss": logged(trainer, "loss"),
        "num_processes": trainer.accelerator.num_processes,
        "layout": f"{trainer.accelerator.num_processes} × {trainer.args.per_device_train_batch_size} × "
        f"{trainer.args.gradient_accumulation_steps}",
    }


def record_path(folder: str, method: str, scope: str, rank: int) -> str:
    return os.path.join(folder, f"{method}_{scope}_rank{rank}.pt")


def load_records(folder: str, method: str, scope: str) -> dict:
    """One layout's run as one record: rank 0's, with every rank's selection pooled in rank order (each generation
    batch's rows as one process would hold them) and ``replicas_equal``: every rank ended with the same weights."""
    first = torch.load(record_path(folder, method, scope, 0))
    ranks = [first] + [torch.load(record_path(folder, method, scope, k)) for k in range(1, first["num_processes"])]
    pooled = [sum(rows, []) for rows in zip(*(record["selection"] for record in ranks), strict=True)]
    replicas_equal = all(torch.equal(record["weights"], ranks[0]["weights"]) for record in ranks)
    return {**ranks[0], "selection": pooled, "replicas_equal": replicas_equal}


def update_difference(record: dict, other: dict) -> float:
    """``|w − w'| / |w − w_0|``: how far apart two runs from one start end, relative to how far ``record`` moved."""
    moved = record["weights"] - record["initial_weights"]
    return ((record["weights"] - other["weights"]).norm() / moved.norm()).item()


def compare(folders: list[str]) -> None:
    print(
        "| method | scope | layouts (processes × micro-batch × accumulation) | weights apart | same tokens selected |"
    )
    print("|---|---|---|---|---|")
    for method in METHODS:
        for scope in COV_SELECTION_SCOPES:
            first = load_records(folders[0], method, scope)
            for folder in folders[1:]:
                other = load_records(folder, method, scope)
                same = (
                    "n/a (selected in the loss)"
                    if scope == "micro_batch"
                    else other["selection"] == first["selection"]
                )
                layout = f"{other['layout']} vs {first['layout']}"
                print(f"| {method} | {scope} | {layout} | {update_difference(first, other):.1e} | {same} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="path of a saved toy policy (made there if missing)")
    parser.add_argument("--out", help="folder for the per-rank records")
    parser.add_argument("--per-device-batch-size", type=int)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1)
    parser.add_argument("--compare", nargs="+", metavar="FOLDER", help="print how far the layouts' runs lie apart")
    options = parser.parse_args(argv)
    if options.compare:
        compare(options.compare)
        return
    if options.out is None or options.per_device_batch_size is None:
        parser.error("--out and --per-device-batch-size are required to train")
    torch.set_num_threads(1)
    lighten()
    if not os.path.exists(os.path.join(options.model, "config.json")):
        if int(os.environ.get("WORLD_SIZE", 1)) > 1:
            parser.error(f"{options.model} holds no model: make it with a one-process run first")
        from trl_entropy.toy import build_toy_policy

        model, tokenizer = build_toy_policy(seed=0)
        model.save_pretrained(options.model)
        tokenizer.save_pretrained(options.model)
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
            torch.save(record, record_path(options.out, method, scope, int(os.environ.get("RANK", 0))))


if __name__ == "__main__":
    sys.exit(main())
