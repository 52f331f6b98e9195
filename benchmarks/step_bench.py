"""Benchmark of one trainer loss step (``compute_loss`` + backward) per trainer, on a random-initialised model or a
real checkpoint.

The trainers are driven through the public API: the trainers and configs of ``trl_entropy`` (top-level names) and
``trl.GRPOTrainer``. For the random-weight presets the model is built from a config (no download) and saved once, and
the batch is a hand-built GRPO micro-batch (prompts, completions with some padding, advantages, rollout log-probs).
For a checkpoint preset the model is the fetched checkpoint and the batch a real one (``chat_batches.py``): chat
arithmetic prompts, completions the model sampled, their rewards' group advantages, and the rollout log-probs and
entropies from the fp32 kernel. Every trainer loads its own copy of the model and gets the same batch.

Each trainer runs one untimed warm-up step, then ``--repeats`` timed steps per round for ``--rounds`` rounds; within
a round the trainers take turns, in an order rotated each round, so that a slow spell of a shared machine falls on
all of them. The table gives per trainer the median and minimum wall time, the median CPU time (``process_time``:
all threads, without the time the process waited), the ratio of its median to the first trainer's (the baseline),
the median over rounds of that ratio taken within each round (paired), and the ratio of the CPU medians. On a shared
CPU, run one thread (``--threads 1``): the CPU time is then the step's own work, and its ratio the robust one.

Presets (``--preset``):

* ``loss-step``: the issue's loss-step shape, ``V = 32768``, hidden size 256, 8 sequences x 96 completion tokens,
  base (``EntropyGRPOTrainer``) against AEnt, fp32 on the CPU.
* ``qwen2-0.5b``: a Qwen2 architecture of ~0.5B parameters (Qwen2-0.5B's shape: 24 layers, hidden 896, vocabulary
  151936, tied embeddings), every trainer against ``trl.GRPOTrainer``, bf16 on CUDA.
* ``toy``: a tiny Qwen2 model, every trainer (the runbook's dry run).
* ``smollm2``: SmolLM2-135M-Instruct, the real checkpoint ``trl_entropy.pretrained.fetch_model`` gives (fetched and
  converted on first use, docs/real_model.md), every trainer against ``trl.GRPOTrainer``: 2 one-digit chat arithmetic
  prompts x 8 sampled completions of at most 24 tokens (the documented training command's micro-batch), fp32 on the
  CPU. ``--cache-dir`` is ``fetch_model``'s; ``--dry-run`` shrinks the batch to 2 completions of 4 tokens, to check
  the path, not to time it.

Examples::

    python benchmarks/step_bench.py --preset loss-step --repeats 5
    python benchmarks/step_bench.py --preset qwen2-0.5b --device cuda --dtype bf16
    python benchmarks/step_bench.py --preset smollm2 --repeats 1 --rounds 5 --threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

PRESETS = {
    "loss-step": dict(
        vocab=32768, hidden=256, layers=2, heads=4, kv_heads=2, mlp=512, batch=8, prompt=32, completion=96,
        trainers=["base", "aent"],
    ),
    "qwen2-0.5b": dict(
        vocab=151936, hidden=896, layers=24, heads=14, kv_heads=2, mlp=4864, batch=8, prompt=256, completion=1024,
        trainers=None,
    ),
    "toy": dict(
        vocab=512, hidden=32, layers=1, heads=2, kv_heads=1, mlp=64, batch=4, prompt=4, completion=6,
        trainers=None,
    ),
    "smollm2": dict(
        checkpoint="smollm2-135m-instruct", prompts=2, generations=8, completion=24, digits=1, trainers=None,
    ),
}  # fmt: skip
# A checkpoint preset's batch under --dry-run: the smallest real batch (one prompt, a group of two).
DRY_RUN_BATCH = dict(prompts=1, generations=2, completion=4)


def _trainer_classes():
    """``trl`` (trl.GRPOTrainer), ``base`` (the shared base, control off) and every registered method by its key."""
    import trl

    from trl_entropy.methods import SPECS

    classes = {"trl": (trl.GRPOTrainer, trl.GRPOConfig)}
    for spec in SPECS:
        classes["base" if spec.key == "grpo" else spec.key] = (spec.trainer_class, spec.config_class)
    return classes


def build_model_dir(spec, dtype, root):
    """A random-initialised Qwen2 model and a word-level tokenizer of the same vocabulary, saved under ``root``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    specials = ["<pad>", "<eos>", "<unk>"]
    vocab = {token: i for i, token in enumerate(specials + [f"t{i}" for i in range(spec["vocab"] - len(specials))])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )
    config = Qwen2Config(
        vocab_size=spec["vocab"],
        hidden_size=spec["hidden"],
        num_hidden_layers=spec["layers"],
        num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"],
        intermediate_size=spec["mlp"],
        max_position_embeddings=spec["prompt"] + spec["completion"] + 8,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(dtype)
    model.save_pretrained(root)
    tokenizer.save_pretrained(root)
    return tokenizer


def make_batch(spec, device, seed=0):
    """A GRPO micro-batch as ``_generate_and_score_completions`` returns it: padded prompts and completions, and the
    rollout policy's log-probs and entropies (``old_entropy``: what it keeps for a trainer that reads them)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    b, p, c, vocab = spec["batch"], spec["prompt"], spec["completion"], spec["vocab"]
    prompt_mask = torch.ones(b, p, dtype=torch.long)
    prompt_mask[0, : p // 2] = 0
    completion_mask = torch.ones(b, c, dtype=torch.long)
    completion_mask[1, c // 2 :] = 0
    batch = {
        "prompt_ids": torch.randint(3, vocab, (b, p), generator=g),
        "prompt_mask": prompt_mask,
        "completion_ids": torch.randint(3, vocab, (b, c), generator=g),
        "completion_mask": completion_mask,
        "advantages": torch.randn(b, generator=g),
        "old_per_token_logps": -torch.rand(b, c, generator=g) * 5,
        "old_entropy": torch.rand(b, c, generator=g) * 5,
        "num_items_in_batch": completion_mask.sum(),
    }
    return {key: value.to(device) for key, value in batch.items()}


def checkpoint_setup(spec, args):
    """A checkpoint preset's model folder (fetched once, then cached), its tokenizer, a real batch sampled by the
    model (``chat_batches.py``) with the rollout log-probs and entropies from the fp32 kernel, and the shape."""
    import torch
    from chat_batches import load_policy, sample_chat_batch, score_fp32

    from trl_entropy.pretrained import fetch_model

    sizes = {key: spec[key] for key in DRY_RUN_BATCH} | (DRY_RUN_BATCH if args.dry_run else {})
    model_dir = fetch_model(spec["checkpoint"], cache_dir=args.cache_dir)
    model, tokenizer = load_policy(model_dir)
    batch = sample_chat_batch(
        model, tokenizer, sizes["prompts"], sizes["generations"], sizes["completion"], seed=0, digits=spec["digits"]
    )
    with torch.no_grad():
        log_probs, entropy = score_fp32(model, batch)
    mask = batch["completion_mask"]
    batch = {key: value for key, value in batch.items() if key != "rewards"}  # the loss step reads the advantages
    batch |= {"old_per_token_logps": log_probs * mask, "old_entropy": entropy * mask, "num_items_in_batch": mask.sum()}
    config = model.config
    shape = dict(
        vocab=config.vocab_size, hidden=config.hidden_size, layers=config.num_hidden_layers,
        batch=mask.size(0), prompt=batch["prompt_ids"].size(1), completion=mask.size(1),
        generations=sizes["generations"],
    )  # fmt: skip
    return model_dir, tokenizer, {key: value.to(args.device) for key, value in batch.items()}, shape


def build_trainer(name, model_dir, tokenizer, spec, args, output_dir):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    trainer_class, config_class = _trainer_classes()[name]
    config = config_class(
        output_dir=output_dir,
        per_device_train_batch_size=spec["batch"],
        num_generations=spec["generations"],
        max_completion_length=spec["completion"],
        report_to=[],
        use_cpu=args.device == "cpu",
        bf16=args.dtype == "bf16",
        gradient_checkpointing=args.gradient_checkpointing,
    )
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    trainer = trainer_class(
        model=model,
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=config,
        train_dataset=Dataset.from_dict({"prompt": ["t1 t2"] * spec["batch"]}),
        processing_class=tokenizer,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop, read by compute_loss
    return trainer


def time_steps(trainer, batch, repeats, device, warm_up):
    """Wall and CPU milliseconds of ``repeats`` loss steps (after one untimed step when ``warm_up``)."""
    import torch

    def step():
        trainer.model.zero_grad(set_to_none=True)
        loss = trainer.compute_loss(trainer.model, dict(batch))
        loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()

    if warm_up:
        step()
    wall, cpu = [], []
    for _ in range(max(repeats, 1)):
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        step()
        wall.append((time.perf_counter() - start_wall) * 1e3)
        cpu.append((time.process_time() - start_cpu) * 1e3)
    trainer.model.zero_grad(set_to_none=True)  # one trainer's gradients at a time: a dozen of a real model's are GBs
    return wall, cpu


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="loss-step")
    parser.add_argument(
        "--trainers", default=None, help="comma-separated subset of trl, base and the method keys (default: all)"
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", choices=["fp32", "bf16"], help="default: fp32 on CPU, bf16 on CUDA")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per trainer and round")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds over the trainers (noisy machines)")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--cache-dir", default=None, help="a checkpoint preset's fetch_model cache (default: its own)")
    parser.add_argument("--dry-run", action="store_true", help="a checkpoint preset with the smallest batch")
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    from trl_entropy.core.trl.noise import hide_known_upstream_noise

    hide_known_upstream_noise()  # a program: TRL's deprecation notices on every config would bury the table

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    spec = PRESETS[args.preset]
    if args.dry_run and "checkpoint" not in spec:
        parser.error("--dry-run shrinks a checkpoint preset's batch; the other presets set their own sizes")
    classes = _trainer_classes()
    names = args.trainers.split(",") if args.trainers else spec["trainers"] or list(classes)
    unknown = set(names) - set(classes)
    if unknown:
        parser.error(f"unknown trainers {sorted(unknown)}")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    with tempfile.TemporaryDirectory() as root:
        if "checkpoint" in spec:
            model_dir, tokenizer, batch, shape = checkpoint_setup(spec, args)
        else:
            model_dir, shape = os.path.join(root, "model"), spec | {"generations": spec["batch"]}
            tokenizer = build_model_dir(spec, dtype, model_dir)
            batch = make_batch(spec, args.device)
        print(
            f"preset={args.preset} device={args.device} dtype={args.dtype} vocab={shape['vocab']} "
            f"hidden={shape['hidden']} layers={shape['layers']} batch={shape['batch']}x({shape['prompt']}+"
            f"{shape['completion']}) scored={int(batch['completion_mask'].sum())} repeats={args.repeats} "
            f"rounds={args.rounds} threads={torch.get_num_threads()}",
            flush=True,
        )
        trainers = {
            name: build_trainer(name, model_dir, tokenizer, shape, args, os.path.join(root, name)) for name in names
        }
        n_params = sum(p.numel() for p in trainers[names[0]].model.parameters())
        print(f"parameters: {n_params / 1e6:.2f} M", flush=True)
        wall = {name: [] for name in names}
        cpu = {name: [] for name in names}
        paired = {name: [] for name in names}  # per round: the trainer's median over the baseline's
        for round_index in range(args.rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                round_wall, round_cpu = time_steps(
                    trainers[name], batch, args.repeats, args.device, warm_up=round_index == 0
                )
                wall[name].append(round_wall)
                cpu[name] += round_cpu
            for name in names:
                paired[name].append(statistics.median(wall[name][-1]) / statistics.median(wall[names[0]][-1]))
            print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr, flush=True)  # a long run's progress
    print(
        "| trainer | loss step ms (median) | min ms | CPU ms (median) | ratio to the first (median) "
        "| paired ratio (median over rounds) | CPU ratio (median) |\n|---|---|---|---|---|---|---|"
    )
    base, base_cpu = statistics.median(sum(wall[names[0]], [])), statistics.median(cpu[names[0]])
    for name in names:
        times = sum(wall[name], [])
        median, median_cpu = statistics.median(times), statistics.median(cpu[name])
        print(
            f"| {name} | {median:.0f} | {min(times):.0f} | {median_cpu:.0f} | {median / base:.2f} "
            f"| {statistics.median(paired[name]):.2f} | {median_cpu / base_cpu:.2f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
