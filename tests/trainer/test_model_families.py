"""Model families whose logits are not ``hidden @ W.T``: soft-capped (Gemma 2), rescaled (Granite) and MoE (Mixtral).

Each tiny model is saved to a directory and passed by path, as users pass a Hub name. With control off, the loss and
every gradient equal `trl.GRPOTrainer`'s (which scores these models with its own fused head, and adds the MoE router
loss); AEnt trains on each, with the clamped entropy of the model's own (transformed) logits checked in float64.
"""

import math

import pytest
import torch
from _support.grpo import make_grpo_batch
from _support.parity import assert_same_step, build_pair
from transformers import AutoModelForCausalLM, Gemma2Config, GraniteConfig, MixtralConfig

from trl_entropy import AEntConfig, AEntTrainer
from trl_entropy.core.head import EntropyHeadRequest, logit_transform
from trl_entropy.toy import build_toy_dataset, toy_reward


TINY = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
# Values chosen so the transform changes the toy model's logits by far more than the tolerances: its logits span a
# few units, a soft-cap at 1.5 bends them strongly, and Granite divides them by 0.25 (a scale of 4).
FAMILIES = {
    "gemma2_softcap": lambda vocab: Gemma2Config(vocab_size=vocab, head_dim=8, final_logit_softcapping=1.5, **TINY),
    "granite_logits_scaling": lambda vocab: GraniteConfig(vocab_size=vocab, logits_scaling=0.25, **TINY),
    "mixtral_router_loss": lambda vocab: MixtralConfig(
        vocab_size=vocab,
        num_local_experts=4,
        num_experts_per_tok=2,
        router_aux_loss_coef=0.5,
        output_router_logits=True,
        **TINY,
    ),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_path(request, tmp_path_factory, toy_tokenizer):
    """``(family name, path)`` of a tiny random model of the family, saved with the toy tokenizer."""
    torch.manual_seed(0)
    config = FAMILIES[request.param](len(toy_tokenizer))
    config.pad_token_id, config.bos_token_id, config.eos_token_id = (
        toy_tokenizer.pad_token_id,
        toy_tokenizer.bos_token_id,
        toy_tokenizer.eos_token_id,
    )
    model = AutoModelForCausalLM.from_config(config)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    toy_tokenizer.save_pretrained(path)
    return request.param, str(path)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_loss_and_gradients_equal_grpo_trainer(family_path, toy_tokenizer, tmp_path, loss_type):
    family, path = family_path
    trl_trainer, our_trainer = build_pair(path, toy_tokenizer, tmp_path, loss_type=loss_type)
    if family == "mixtral_router_loss":
        assert trl_trainer.aux_loss_enabled and our_trainer.aux_loss_enabled
    inputs = make_grpo_batch(trl_trainer.model, len(toy_tokenizer), seed=3)
    assert_same_step(trl_trainer, our_trainer, inputs)
    for key in ("entropy", "aux_loss"):
        assert our_trainer._metrics["train"][key] == pytest.approx(trl_trainer._metrics["train"][key], rel=1e-5)
    if family == "mixtral_router_loss":  # the router loss is really part of the loss, not a rounding-level term
        (aux_loss,) = our_trainer._metrics["train"]["aux_loss"]
        assert 0.5 * aux_loss > 0.1


def test_logit_transform_is_read_as_trl_reads_it():
    """The attribute each family uses, with TRL 1.16's precedence and Granite's division."""
    table = [
        (Gemma2Config(final_logit_softcapping=30.0), (1.0, 30.0)),
        (GraniteConfig(logits_scaling=8.0), (1 / 8.0, None)),
        (MixtralConfig(), (1.0, None)),
    ]
    for config, expected in table:
        assert logit_transform(config) == pytest.approx(expected)
    hyperclova = GraniteConfig(logits_scaling=8.0)
    hyperclova.model_type = "hyperclovax"  # HyperCLOVA X multiplies by logits_scaling
    assert logit_transform(hyperclova) == (8.0, None)
    cohere_style = MixtralConfig()
    cohere_style.logit_scale, cohere_style.output_multiplier = 0.0625, 3.0  # the first one set wins
    assert logit_transform(cohere_style) == (0.0625, None)


def naive_clamped_entropy(logits: torch.Tensor, clamp_fraction: float) -> torch.Tensor:
    """AEnt's clamped entropy (arXiv:2509.03493; docs/aent.md): drop the floor(p·V) smallest logits, entropy of the
    softmax over the rest (float64)."""
    logits = logits.double()
    vocab = logits.size(-1)
    kept = logits.topk(vocab - math.floor(clamp_fraction * vocab), dim=-1).values
    log_probs = kept.log_softmax(-1)
    return -(log_probs.exp() * log_probs).sum(-1)


def test_aent_clamped_entropy_is_taken_on_the_transformed_logits(family_path, toy_tokenizer, tmp_path):
    _, path = family_path
    model = AutoModelForCausalLM.from_pretrained(path)
    trainer = AEntTrainer(
        model=model,
        reward_funcs=toy_reward,
        args=AEntConfig(
            output_dir=str(tmp_path),
            per_device_train_batch_size=4,
            num_generations=4,
            report_to=[],
            use_cpu=True,
            bf16=False,
            temperature=0.7,
            max_completion_length=8,  # a random model seldom ends a completion: its two training steps stay short
        ),
        train_dataset=build_toy_dataset(8),
        processing_class=toy_tokenizer,
    )
    inputs = make_grpo_batch(model, len(toy_tokenizer), seed=5)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    keep = inputs["completion_ids"].size(1)
    clamp_fraction = trainer.args.aent_clamp_fraction
    with torch.no_grad():
        # The model's own forward applies its soft-cap / scale; TRL divides by the temperature.
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -keep - 1 : -1] / 0.7
        ours = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            entropy_head=EntropyHeadRequest(logits_to_keep=keep, clamp_fraction=clamp_fraction),
        )
    mask = inputs["completion_mask"].bool()
    expected = naive_clamped_entropy(logits, clamp_fraction)
    torch.testing.assert_close(ours.clamped_entropy[mask].double(), expected[mask], rtol=1e-5, atol=1e-6)
    log_probs = logits.double().log_softmax(-1)
    torch.testing.assert_close(
        ours.log_probs[mask].double(),
        log_probs.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)[mask],
        rtol=1e-5,
        atol=1e-6,
    )
    # ... and AEnt trains on the family: two optimizer steps move the weights.
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.args.max_steps = 2
    trainer.train()
    assert all(math.isfinite(entry.get("loss", 0.0)) for entry in trainer.state.log_history)
    assert any(not torch.equal(before[name], p) for name, p in trainer.model.named_parameters())
