"""Each trainer trains a PEFT LoRA adapter through the fused kernel; the saved adapter reproduces the trained model."""

import math

import pytest
import torch
from _support.distributed_run import logged, make_trainer
from _support.grpo import full_logit_log_probs, lora_config
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM

import trl_entropy.core.head
from trl_entropy.methods import METHODS


class KernelCalls:
    """Counts the fused kernel's calls, and those whose hidden states carry a gradient (the loss's)."""

    def __init__(self, kernel):
        self.kernel, self.calls, self.with_grad = kernel, 0, 0

    def __call__(self, hidden_states, *args, **kwargs):
        self.calls += 1
        self.with_grad += int(hidden_states.requires_grad)
        return self.kernel(hidden_states, *args, **kwargs)


def probe_batch(tokenizer):
    """Prompts and completions of the toy task, right-padded completions."""
    texts = [("3+4=", "7"), ("12+9=", "21"), ("0+0=", "10"), ("19+19=", "38")]
    prompts = tokenizer([p for p, _ in texts], return_tensors="pt", padding=True, add_special_tokens=False)
    completions = tokenizer(
        [c for _, c in texts], return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False
    )
    input_ids = torch.cat([prompts["input_ids"], completions["input_ids"]], 1)
    attention_mask = torch.cat([prompts["attention_mask"], completions["attention_mask"]], 1)
    return input_ids, attention_mask, completions["input_ids"].size(1), completions["attention_mask"].bool()


@pytest.mark.parametrize("method", sorted(METHODS))
def test_lora_adapter_trains_saves_and_reloads(method, warm_toy_policy_path, toy_tokenizer, tmp_path, monkeypatch):
    counter = KernelCalls(trl_entropy.core.head.chunked_logprob_entropy)
    monkeypatch.setattr(trl_entropy.core.head, "chunked_logprob_entropy", counter)
    trainer = make_trainer(
        method,
        warm_toy_policy_path,
        str(tmp_path / "run"),
        max_steps=2,
        learning_rate=1e-2,
        trainer_kwargs={"peft_config": lora_config()},
    )
    model = trainer.model
    assert isinstance(model, PeftModel)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    trainer.train()

    changed = {name for name, p in model.named_parameters() if not torch.equal(before[name], p.detach())}
    assert changed, "nothing trained"
    assert changed <= trainable, f"weights outside the adapter changed: {sorted(changed - trainable)}"
    assert any("lora_B" in name for name in changed)
    # The loss went through the fused kernel (with a gradient), not through full logits.
    assert counter.with_grad >= 2, counter.__dict__
    for entry in logged(trainer, "entropy"):
        assert 0 < entry < math.log(len(toy_tokenizer))

    # The saved adapter, loaded on a fresh base model, gives the trained model's log-probs.
    trainer.save_model(str(tmp_path / "adapter"))
    base = AutoModelForCausalLM.from_pretrained(warm_toy_policy_path, dtype=torch.float32)
    reloaded = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    input_ids, attention_mask, completion_length, mask = probe_batch(toy_tokenizer)
    model.eval()
    with torch.no_grad():
        trained = trainer.score_tokens(model, input_ids, attention_mask, completion_length).log_probs
    expected = full_logit_log_probs(reloaded, input_ids, attention_mask, completion_length)
    torch.testing.assert_close(trained[mask].double(), expected[mask], rtol=1e-5, atol=1e-5)
    # ... and not the base model's: the adapter matters.
    untouched = full_logit_log_probs(
        AutoModelForCausalLM.from_pretrained(warm_toy_policy_path, dtype=torch.float32),
        input_ids,
        attention_mask,
        completion_length,
    )
    assert (untouched[mask] - expected[mask]).abs().max() > 1e-3


def test_lora_reference_is_the_base_model(warm_toy_policy_path, tmp_path):
    """With beta > 0 and no reference copy, TRL scores the reference with the adapter off: KL is 0 at the start."""
    trainer = make_trainer(
        "aent",
        warm_toy_policy_path,
        str(tmp_path),
        max_steps=3,
        learning_rate=1e-2,
        beta=0.1,
        trainer_kwargs={"peft_config": lora_config()},
    )
    assert trainer.ref_model is None
    trainer.train()
    kl = logged(trainer, "kl")
    assert len(kl) == 3
    assert kl[0] == pytest.approx(0.0, abs=1e-6)  # lora_B starts at 0: the adapted policy is the base model
    assert kl[-1] > 1e-6  # once the adapter moves, the adapter-off reference differs


def test_trainable_token_rows_of_a_tied_head(warm_toy_policy_path, toy_tokenizer, tmp_path):
    """PEFT's `trainable_token_indices` wraps the tied head (a wrapper without `bias`); the kernel scores through it
    and the trained rows are the head's rows: the kernel's log-probs equal the full-logit ones of the trained model."""
    config = LoraConfig(
        r=4, target_modules=["q_proj", "v_proj"], trainable_token_indices=[5, 6, 7], task_type="CAUSAL_LM"
    )
    trainer = make_trainer(
        "grpo",
        warm_toy_policy_path,
        str(tmp_path),
        max_steps=2,
        learning_rate=1e-2,
        trainer_kwargs={"peft_config": config},
    )
    trainer.train()
    trained_rows = [p for name, p in trainer.model.named_parameters() if "trainable_tokens_delta" in name]
    assert trained_rows and any(p.detach().abs().max() > 0 for p in trained_rows)
    input_ids, attention_mask, completion_length, mask = probe_batch(toy_tokenizer)
    trainer.model.eval()
    with torch.no_grad():
        scored = trainer.score_tokens(trainer.model, input_ids, attention_mask, completion_length).log_probs
    expected = full_logit_log_probs(trainer.model, input_ids, attention_mask, completion_length)
    torch.testing.assert_close(scored[mask].double(), expected[mask], rtol=1e-5, atol=1e-5)
