"""Vision-language models, trained as `trl.GRPOTrainer` trains them.

Tiny VLMs of five families (`_support/vlm.py`: Qwen2-VL, Qwen2.5-VL, Gemma 3, LLaVA, Idefics3 / SmolVLM), random
weights, built offline. With control off, one loss step on a batch of the processor's own output (a prompt with one
image, one with two, one without, in the same micro-batch) gives the loss and every gradient `trl.GRPOTrainer` gives,
the vision tower's included; the entropy methods train on them through TRL's generation path, with LoRA, across a
resume in the middle of a generation cycle; bad input is refused with the model's class and the fix.
"""

import math
import os

import pytest
import torch
from _support.distributed_run import ControllerRecorder, logged
from _support.grpo import loss_and_gradients
from _support.parity import assert_same_step, build_pair
from _support.resume import CHECKPOINT, STEPS, assert_resumed_equals_straight
from _support.vlm import (
    FAMILIES,
    answer_reward,
    build_vlm,
    clamped_entropy_controllers,
    covariance_methods,
    image_question_dataset,
    make_vlm_batch,
    two_image_dataset,
    vlm_trainer,
)

from trl_entropy import EntropyGRPOConfig, EntropyGRPOTrainer
from trl_entropy.core.checkpoint import GENERATION_BATCH_FILE
from trl_entropy.core.head import EntropyHeadRequest, install_entropy_head, score_completions
from trl_entropy.core.multimodal import multimodal_inputs
from trl_entropy.methods import METHODS, combination


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def vlm(request, tmp_path_factory):
    """``(family, path, processor)``: a tiny random VLM of the family saved to ``path``, and its processor."""
    model, processor = build_vlm(request.param)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, str(path), processor


def vision_gradients(gradients: dict) -> dict:
    """The entries (gradients, or names) of the vision tower and its projector into the language model."""
    words = ("visual", "vision", "multi_modal_projector", "connector")
    return {name: grad for name, grad in gradients.items() if any(word in name for word in words)}


def patch_embedding(entries: dict) -> dict:
    """The entries of the vision tower's first layer, its patch embedding: a gradient reaches it only if the images
    reach the scores."""
    return {name: entry for name, entry in entries.items() if "patch_embed" in name}


def test_loss_and_gradients_equal_grpo_trainer(vlm, tmp_path):
    """Control off, beta > 0: one loss step on a micro-batch whose rows hold one, two and no images gives
    trl.GRPOTrainer's loss and every gradient; the gradient reaches the vision tower's patch embedding."""
    family, path, processor = vlm
    trl_trainer, our_trainer = build_pair(
        path, processor, tmp_path, train_dataset=image_question_dataset(), reward_funcs=answer_reward, beta=0.04
    )
    inputs = make_vlm_batch(trl_trainer.model, processor, seed=3)
    assert_same_step(trl_trainer, our_trainer, inputs)
    _, gradients = loss_and_gradients(our_trainer, inputs)
    assert patch_embedding(gradients), family
    assert all(grad.abs().max() > 0 for grad in patch_embedding(gradients).values()), family


@pytest.mark.parametrize("batch_size", [1, 3])
def test_sliced_scoring_equals_grpo_trainer_in_one_pass(vlm, tmp_path, batch_size):
    """The rollout and reference log-probs TRL asks for ``batch_size`` rows at a time: each slice gets its own rows'
    images (one, two or none per row; a slice of the row without an image gets none, where TRL would pass empty image
    tensors that the vision tower fails on), the log-probs and entropies TRL's own head gives all rows at once."""
    _, path, processor = vlm
    trl_trainer, our_trainer = build_pair(
        path, processor, tmp_path, train_dataset=image_question_dataset(), reward_funcs=answer_reward
    )
    inputs = make_vlm_batch(trl_trainer.model, processor, seed=4)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    multimodal = multimodal_inputs(inputs)
    scored = []
    for trainer, rows in ((trl_trainer, None), (our_trainer, batch_size)):
        with torch.no_grad():
            log_probs, entropy, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model, input_ids, attention_mask, 6, rows, compute_entropy=True, **multimodal
            )
        scored.append((log_probs, entropy))
    (trl_log_probs, trl_entropy), (our_log_probs, our_entropy) = scored
    mask = inputs["completion_mask"].bool()
    torch.testing.assert_close(our_log_probs[mask], trl_log_probs[mask], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(our_entropy[mask], trl_entropy[mask], rtol=1e-5, atol=1e-6)


def test_head_scores_the_completion_positions_as_the_model_s_own_logits(vlm):
    """The log-probs, entropies and clamped entropies (AEnt's statistic) of the completion positions, from the LM head
    where the family keeps it, equal float64 ones from the model's own logits, soft-capped as the text config says
    (Gemma 3's cap of 1.5: transformers' Gemma3ForConditionalGeneration leaves its logits uncapped, TRL's fused head
    caps them, and so does the entropy head, to train as TRL does); masked positions are zero. Sliced one row at a
    time too."""
    family, _, processor = vlm
    model, _ = build_vlm(family)
    install_entropy_head(model, temperature=0.7)
    inputs = make_vlm_batch(model, processor, seed=5)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    multimodal = multimodal_inputs(inputs)
    keep = inputs["completion_ids"].size(1)
    with torch.no_grad():
        forward_inputs = {key: value for key, value in multimodal.items() if key != "num_images"}
        logits = model(input_ids=input_ids, attention_mask=attention_mask, **forward_inputs).logits.double()
        cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
        if cap is not None:
            logits = cap * torch.tanh(logits / cap)
        log_softmax = (logits[:, -keep - 1 : -1] / 0.7).log_softmax(-1)
        request = EntropyHeadRequest(logits_to_keep=keep, clamp_fraction=0.2)
        whole = score_completions(model, input_ids, attention_mask, request, multimodal=multimodal)
        by_row = score_completions(model, input_ids, attention_mask, request, batch_size=1, multimodal=multimodal)
    mask = inputs["completion_mask"].bool()
    expected = {
        "log_probs": log_softmax.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1),
        "entropy": -(log_softmax.exp() * log_softmax).sum(-1),
        "clamped_entropy": naive_clamped_entropy(logits[:, -keep - 1 : -1] / 0.7, 0.2),
    }
    for scored in (whole, by_row):
        for name, values in expected.items():
            ours = getattr(scored, name)
            torch.testing.assert_close(ours[mask].double(), values[mask], rtol=1e-5, atol=1e-5, msg=name)
            assert not ours[~mask].any(), name  # nothing outside the completion


def naive_clamped_entropy(logits: torch.Tensor, clamp_fraction: float) -> torch.Tensor:
    """AEnt's clamped entropy in float64: the entropy of the softmax over the logits left once the floor(p·V)
    smallest are dropped."""
    vocabulary = logits.size(-1)
    kept = logits.double().topk(vocabulary - math.floor(clamp_fraction * vocabulary), dim=-1).values
    log_probs = kept.log_softmax(-1)
    return -(log_probs.exp() * log_probs).sum(-1)


# Every method on Qwen2-VL, and the two below combined; on every other family, a controller on the clamped entropy
# (AEnt) and a covariance method (the second of Clip-Cov and KL-Cov, with two updates per rollout).
CONTROLLER, COVARIANCE = clamped_entropy_controllers()[0], covariance_methods()[-1]
COMBINED = combination([CONTROLLER, COVARIANCE]).key
TRAINING_CASES = [("qwen2_vl", method) for method in [*sorted(METHODS), COMBINED]] + [
    (family, method) for family in sorted(FAMILIES) if family != "qwen2_vl" for method in (CONTROLLER, COVARIANCE)
]


@pytest.mark.parametrize("family, method", TRAINING_CASES, ids=[f"{f}-{m}" for f, m in TRAINING_CASES])
def test_method_trains_a_vlm_for_two_steps(family, method, tmp_path):
    """Two optimizer steps through TRL's generation path on the image-question dataset (TRL's shape: an ``image``
    column, conversational prompts): finite losses, and the language model and the vision tower both move."""
    model, processor = build_vlm(family)
    before = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    trainer = vlm_trainer(method, model, processor, str(tmp_path))
    trainer.train()
    losses = logged(trainer, "loss")
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    moved = {name for name, parameter in trainer.model.named_parameters() if not torch.equal(before[name], parameter)}
    assert patch_embedding(dict.fromkeys(moved)), f"{family}: the vision tower did not train"
    assert moved - set(vision_gradients(dict.fromkeys(moved))), f"{family}: the language model did not train"


@pytest.mark.parametrize("method", covariance_methods())
def test_a_covariance_selection_over_the_generation_batch_scores_it_with_its_images(method, tmp_path):
    """On-policy TRL scores no rollout log-probs: the selection over the whole generation batch scores it itself,
    with the batch's images (without them the prompts' image placeholders are refused)."""
    model, processor = build_vlm("qwen2_vl")
    trainer = vlm_trainer(method, model, processor, str(tmp_path), cov_selection_scope="generation_batch")
    trainer.train()
    losses = logged(trainer, "loss")
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)


class RatioRecorder(EntropyGRPOTrainer):
    """The base, recording how far each micro-batch's log-probs lie from the rollout log-probs TRL scored."""

    rollout_gaps: tuple[float, ...] = ()

    def completion_batch(self, inputs, scored):
        assert inputs.get("old_per_token_logps") is not None, "TRL scored no rollout log-probs: nothing to compare"
        batch = super().completion_batch(inputs, scored)
        gap = ((batch.log_probs - batch.old_log_probs).abs() * batch.mask).max().item()
        self.rollout_gaps = (*self.rollout_gaps, gap)
        return batch


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3", "idefics3"])
def test_two_images_per_prompt_are_scored_alike_by_slice_and_by_micro_batch(family, tmp_path):
    """TRL's ``images`` column (two images a row, the prompt's messages holding the image parts) through TRL's whole
    path: the rollout log-probs of a generation batch of two micro-batches, scored a micro-batch at a time, equal the
    loss step's log-probs of the first micro-batch (no update in between: the ratio is 1), whichever rows TRL's
    shuffle put together."""
    model, processor = build_vlm(family)
    trainer = vlm_trainer(
        "grpo",
        model,
        processor,
        str(tmp_path),
        dataset=two_image_dataset(),
        trainer_class=RatioRecorder,
        steps_per_generation=2,  # a generation batch of two micro-batches; TRL scores it one at a time
        max_steps=1,
    )
    trainer.train()
    (gap,) = trainer.rollout_gaps
    assert gap < 1e-5


# ---------------------------------------------------------------------------------------------------------------------
# Bad input: refused with the model's class and what to change
# ---------------------------------------------------------------------------------------------------------------------


def image_question_trainer(model, processing_class, output_dir):
    """The base on four image questions."""
    return EntropyGRPOTrainer(
        model=model,
        reward_funcs=answer_reward,
        args=EntropyGRPOConfig(output_dir=str(output_dir), report_to=[], use_cpu=True, num_generations=4),
        train_dataset=image_question_dataset(4),
        processing_class=processing_class,
    )


def test_image_column_for_a_text_only_model_is_refused(toy_model_path, toy_tokenizer, tmp_path):
    with pytest.raises(ValueError, match=r"train_dataset has an 'image' column, but LlamaForCausalLM .* text-only"):
        image_question_trainer(toy_model_path, toy_tokenizer, tmp_path)


@pytest.fixture(scope="module")
def llava_pair(tmp_path_factory):
    """``(trl.GRPOTrainer, EntropyGRPOTrainer, processor)`` on the tiny LLaVA."""
    model, processor = build_vlm("llava")
    path = tmp_path_factory.mktemp("llava_bad_input")
    model.save_pretrained(path)
    trl_trainer, our_trainer = build_pair(
        str(path), processor, path, train_dataset=image_question_dataset(), reward_funcs=answer_reward
    )
    return trl_trainer, our_trainer, processor


def test_image_placeholder_in_a_completion_is_refused(llava_pair):
    """A policy that samples its own image token: the forward would look for an image to put there."""
    _, trainer, processor = llava_pair
    inputs = make_vlm_batch(trainer.model, processor, seed=6)
    placeholder = processor.tokenizer.convert_tokens_to_ids("<image>")
    inputs["completion_ids"][0, 2] = placeholder
    with pytest.raises(ValueError, match=rf"LlavaForConditionalGeneration.*suppress_tokens': \[{placeholder}\]"):
        trainer.compute_loss(trainer.model, inputs)


def test_image_placeholders_without_images_are_refused(llava_pair):
    """Prompts holding image tokens in a batch without images: the tokens' own embeddings would stand in."""
    _, trainer, processor = llava_pair
    inputs = make_vlm_batch(trainer.model, processor, seed=6)
    del inputs["pixel_values"], inputs["num_images"]
    message = r"image placeholder token\(s\) of LlavaForConditionalGeneration .* no images"
    with pytest.raises(ValueError, match=message):
        trainer.compute_loss(trainer.model, inputs)


def test_image_token_count_that_does_not_match_the_images_is_refused(llava_pair):
    """One image short of the prompts' placeholders: transformers' own check, with the class and the fix."""
    _, trainer, processor = llava_pair
    inputs = make_vlm_batch(trainer.model, processor, seed=6)
    inputs["pixel_values"], inputs["num_images"] = inputs["pixel_values"][:-1], [1, 2, 0, 0]
    with pytest.raises(ValueError, match="LlavaForConditionalGeneration: Image features and image tokens do not"):
        trainer.compute_loss(trainer.model, inputs)


def test_a_model_input_the_head_would_drop_is_refused(llava_pair):
    """A multimodal keyword a later TRL scores with (here a video's pixels) is refused, not left out of the forward."""
    _, trainer, processor = llava_pair
    inputs = make_vlm_batch(trainer.model, processor, seed=6)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with pytest.raises(NotImplementedError, match=r"\['pixel_values_videos'\].*core/multimodal.py"):
        trainer._get_per_token_logps_and_entropies(
            trainer.model, input_ids, attention_mask, 6, **multimodal_inputs(inputs), pixel_values_videos=torch.ones(1)
        )


def test_vlm_without_a_findable_lm_head_is_refused(tmp_path):
    """AutoModel's VLM backbone (no LM head): refused before TRL's set-up, naming the class to load instead."""
    from transformers import Qwen2VLModel

    model, processor = build_vlm("qwen2_vl")
    backbone = Qwen2VLModel(model.config)
    with pytest.raises(ValueError, match=r"Qwen2VLModel has no output embedding.*AutoModelForImageTextToText"):
        image_question_trainer(backbone, processor, tmp_path)


# ---------------------------------------------------------------------------------------------------------------------
# LoRA, resume
# ---------------------------------------------------------------------------------------------------------------------


def test_lora_adapter_trains_a_vlm_saves_and_reloads(tmp_path):
    """A LoRA adapter on Qwen2-VL's language model, trained by AEnt (``CONTROLLER``): only the adapter moves; the
    reference (the adapter switched off, beta > 0) starts at KL 0; the saved adapter on a fresh base gives the trained
    model's log-probs, image included."""
    from peft import LoraConfig, PeftModel
    from transformers import Qwen2VLForConditionalGeneration

    model, processor = build_vlm("qwen2_vl")
    model.save_pretrained(tmp_path / "base")
    adapter = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = vlm_trainer(
        CONTROLLER,
        str(tmp_path / "base"),
        processor,
        str(tmp_path / "run"),
        learning_rate=1e-2,
        beta=0.1,
        trainer_kwargs={"peft_config": adapter},
    )
    assert isinstance(trainer.model, PeftModel) and trainer.ref_model is None
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainable = {name for name, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    trainer.train()
    changed = {name for name, p in trainer.model.named_parameters() if not torch.equal(before[name], p.detach())}
    assert changed and changed <= trainable
    kl = logged(trainer, "kl")
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and kl[-1] > 1e-7

    trainer.save_model(str(tmp_path / "adapter"))
    base = Qwen2VLForConditionalGeneration.from_pretrained(tmp_path / "base", dtype=torch.float32)
    reloaded = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    inputs = make_vlm_batch(reloaded, processor, seed=7)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    trainer.model.eval()
    with torch.no_grad():
        trained = trainer.score_tokens(trainer.model, input_ids, attention_mask, 6, multimodal=inputs).log_probs
    with torch.no_grad():
        forward_inputs = {k: v for k, v in multimodal_inputs(inputs).items() if k != "num_images"}
        logits = reloaded(input_ids=input_ids, attention_mask=attention_mask, **forward_inputs).logits.double()
    expected = logits[:, -7:-1].log_softmax(-1).gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
    mask = inputs["completion_mask"].bool()
    torch.testing.assert_close(trained[mask].double(), expected[mask], rtol=1e-5, atol=1e-5)


def vlm_resume_run(path, processor, output_dir, resume_from=None):
    """AEnt (``CONTROLLER``) on Qwen2-VL for ``STEPS`` steps, two per generation cycle, a checkpoint at every step;
    returns the trainer and the controller value after each step."""
    from transformers import Qwen2VLForConditionalGeneration

    model = Qwen2VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
    trainer = vlm_trainer(
        CONTROLLER,
        model,
        processor,
        output_dir,
        num_iterations=2,
        max_steps=STEPS,
        save_strategy="steps",
        save_steps=1,
    )
    recorder = ControllerRecorder.attached_to(trainer)
    trainer.train(resume_from_checkpoint=resume_from)
    return trainer, recorder.values


def test_vlm_resumed_mid_cycle_equals_the_straight_run(tmp_path):
    """Resumed from the checkpoint inside the first generation cycle (its images among the buffered batch), the run
    continues the straight one: losses, entropies, gradient norms, rewards, AEnt's coefficient, the weights."""
    model, processor = build_vlm("qwen2_vl")
    model.save_pretrained(tmp_path / "base")
    path = str(tmp_path / "base")
    straight, straight_values = vlm_resume_run(path, processor, str(tmp_path / "straight"))
    checkpoint = str(tmp_path / "straight" / f"checkpoint-{CHECKPOINT}")
    resumed, resumed_values = vlm_resume_run(path, processor, str(tmp_path / "resumed"), resume_from=checkpoint)
    assert len(set(straight_values)) > 1, "the controller never moved: its comparison would be vacuous"
    assert_resumed_equals_straight(straight, straight_values, resumed, resumed_values)
    buffered = torch.load(os.path.join(checkpoint, GENERATION_BATCH_FILE.format(process_index=0)), weights_only=True)
    assert all("pixel_values" in micro_batch for micro_batch in buffered)
