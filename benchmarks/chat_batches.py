"""Real GRPO batches on the chat arithmetic task, for the benchmarks that run a real checkpoint (``step_bench.py
--preset smollm2``, ``bf16_clip_flips.py``): prompts from ``trl_entropy.toy.build_chat_arithmetic_dataset`` through
the model's chat template, completions the model samples itself, ``stated_answer_reward`` and TRL's group
advantages, and the completion tokens' log-probs and entropies from the fp32 kernel, as the trainers score them.

Not a module of the package: the benchmarks import it from their own folder.
"""

from __future__ import annotations

import torch

from trl_entropy.core.trl.advantages import advantages_around_baseline
from trl_entropy.kernels import chunked_logprob_entropy
from trl_entropy.rewards import stated_answer_reward
from trl_entropy.toy import build_chat_arithmetic_dataset


def load_policy(model_dir: str, dtype: torch.dtype = torch.float32):
    """The checkpoint's model (eval mode) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


def sample_chat_batch(model, tokenizer, prompts: int, generations: int, completion_length: int, seed: int, digits=1):
    """A GRPO generation batch as TRL's ``_generate_and_score_completions`` builds it, sampled from ``model``.

    ``prompts`` training-split problems (drawn with ``seed``), each rendered by the chat template with the generation
    prompt and left-padded; ``generations`` completions each of at most ``completion_length`` tokens, sampled at
    temperature 1 with top-k and top-p off (TRL's defaults). The completion mask keeps every token up to and
    including the first eos, as TRL's does. Returns the tensors a loss step reads (``prompt_ids``, ``prompt_mask``,
    ``completion_ids``, ``completion_mask``, ``advantages``) and the ``rewards``.
    """
    rows = build_chat_arithmetic_dataset(prompts, split="train", digits=digits, seed=seed)
    texts = [tokenizer.apply_chat_template(row, tokenize=False, add_generation_prompt=True) for row in rows["prompt"]]
    # The template already holds its special tokens; TRL tokenizes the rendered text without adding more.
    encoded = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    prompt_ids = encoded["input_ids"].repeat_interleave(generations, dim=0)
    prompt_mask = encoded["attention_mask"].repeat_interleave(generations, dim=0)
    torch.manual_seed(seed)
    with torch.no_grad():
        sequences = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=completion_length,
            pad_token_id=tokenizer.pad_token_id,
        )
    completion_ids = sequences[:, prompt_ids.size(1) :]
    is_eos = completion_ids == tokenizer.eos_token_id
    first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), completion_ids.size(1))
    positions = torch.arange(completion_ids.size(1)).expand_as(completion_ids)
    completion_mask = (positions <= first_eos.unsqueeze(1)).long()
    kept = [ids[:length].tolist() for ids, length in zip(completion_ids, completion_mask.sum(1))]
    texts = tokenizer.batch_decode(kept, skip_special_tokens=True)
    answers = [answer for answer in rows["answer"] for _ in range(generations)]
    rewards = torch.tensor(stated_answer_reward(texts, answer=answers))
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": advantages_around_baseline(rewards, generations, "group"),
        "rewards": rewards,
    }


def completion_hidden_states(model, batch) -> torch.Tensor:
    """The backbone's last hidden states at the positions that predict the completion tokens, ``(B, T, d)``. Only
    ``input_ids`` and ``attention_mask`` go in, as TRL's scoring passes them."""
    completion_length = batch["completion_ids"].size(1)
    outputs = model.get_decoder()(
        input_ids=torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1),
        attention_mask=torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1),
    )
    return outputs.last_hidden_state[:, -completion_length - 1 : -1]


def score_fp32(model, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies of the completion, ``(B, T)`` fp32, from the fp32 kernel on the model's
    own hidden states (what the trainers' entropy head computes; no clamp). Differentiable."""
    hidden = completion_hidden_states(model, batch)
    targets = batch["completion_ids"]
    log_probs, entropy, _ = chunked_logprob_entropy(
        hidden.reshape(-1, hidden.size(-1)), model.get_output_embeddings().weight, targets.reshape(-1)
    )
    return log_probs.view_as(targets), entropy.view_as(targets)
