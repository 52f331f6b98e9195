"""Benchmark of one trainer loss step (``compute_loss`` + backward) per trainer, on a random-initialised model.

Uses only the public API: the trainers and configs of ``trl_entropy`` (top-level names) and ``trl.GRPOTrainer``. The
model is built from a config (no download) and saved once; every trainer loads it from there. The batch is a
hand-built GRPO micro-batch (prompts, completions with some padding, advantages, rollout log-probs), the same for
every trainer. Each trainer runs ``--repeats`` timed steps after one warm-up step; the table gives the median, the
minimum and the ratio of the median to the first trainer's (the baseline).

Presets (``--preset``):

* ``loss-step``: the issue's loss-step shape, ``V = 32768``, hidden size 256, 8 sequences x 96 completion tokens,
  base (``EntropyGRPOTrainer``) against AEnt, fp32 on the CPU.
* ``qwen2-0.5b``: a Qwen2 architecture of ~0.5B parameters (Qwen2-0.5B's shape: 24 layers, hidden 896, vocabulary
  151936, tied embeddings), every trainer against ``trl.GRPOTrainer``, bf16 on CUDA.
* ``toy``: a tiny Qwen2 model, every trainer (the runbook's dry run).

Examples::

    python benchmarks/step_bench.py --preset loss-step --repeats 5
    python benchmarks/step_bench.py --preset qwen2-0.5b --device cuda --dtype bf16
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
}  # fmt: skip


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


def build_trainer(name, model_dir, tokenizer, spec, args, output_dir):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    trainer_class, config_class = _trainer_classes()[name]
    config = config_class(
        output_dir=output_dir,
        per_device_train_batch_size=spec["batch"],
        num_generations=spec["batch"],
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


def time_steps(trainer, batch, repeats, device):
    import torch

    def step():
        trainer.model.zero_grad(set_to_none=True)
        loss = trainer.compute_loss(trainer.model, dict(batch))
        loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()

    step()
    times = []
    for _ in range(max(repeats, 1)):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="loss-step")
    parser.add_argument(
        "--trainers", default=None, help="comma-separated subset of trl, base and the method keys (default: all)"
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", choices=["fp32", "bf16"], help="default: fp32 on CPU, bf16 on CUDA")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds over the trainers (noisy machines)")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    spec = PRESETS[args.preset]
    classes = _trainer_classes()
    names = args.trainers.split(",") if args.trainers else spec["trainers"] or list(classes)
    unknown = set(names) - set(classes)
    if unknown:
        parser.error(f"unknown trainers {sorted(unknown)}")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    tokens = spec["batch"] * spec["completion"]
    print(
        f"preset={args.preset} device={args.device} dtype={args.dtype} vocab={spec['vocab']} hidden={spec['hidden']} "
        f"layers={spec['layers']} batch={spec['batch']}x({spec['prompt']}+{spec['completion']}) scored={tokens} "
        f"repeats={args.repeats} rounds={args.rounds} threads={torch.get_num_threads()}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as root:
        model_dir = os.path.join(root, "model")
        tokenizer = build_model_dir(spec, dtype, model_dir)
        n_params = None
        batch = make_batch(spec, args.device)
        trainers = {}
        for name in names:
            trainers[name] = build_trainer(name, model_dir, tokenizer, spec, args, os.path.join(root, name))
            n_params = n_params or sum(p.numel() for p in trainers[name].model.parameters())
        print(f"parameters: {n_params / 1e6:.2f} M", flush=True)
        times = {name: [] for name in names}
        for _ in range(args.rounds):
            for name in names:
                times[name] += time_steps(trainers[name], batch, args.repeats, args.device)
    print("| trainer | loss step ms (median) | min ms | ratio to the first (median) |\n|---|---|---|---|")
    base = statistics.median(times[names[0]])
    for name in names:
        median = statistics.median(times[name])
        print(f"| {name} | {median:.0f} | {min(times[name]):.0f} | {median / base:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
