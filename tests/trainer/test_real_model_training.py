"""Every trainer on a real pretrained model, SmolLM2-135M-Instruct (the ``smollm2_path`` fixture), on the chat
arithmetic task:

* with control off, the base equals ``trl.GRPOTrainer`` for every loss type: the loss and every gradient of one loss
  step on a real batch (the model's own samples for chat prompts, its peaked distributions included);
* every registered method, and methods combined, trains two optimizer steps from Python: finite losses and entropy,
  the method's own metric logged, the weights moved;
* a run resumed from a checkpoint inside a generation cycle continues the straight run;
* LoRA: only the adapter trains, and the entropy head scores through it.

Rewards are the task's plus the completion's place in its group, so every step has advantages and a gradient whatever
the model samples.
"""

import gc
import math

import pytest
import torch
from _support.distributed_run import ADAPTIVE_METHODS, ControllerRecorder, logged, make_trainer
from _support.grpo import full_logit_log_probs, lora_config, naive_log_softmax
from _support.methods import METHOD_METRIC, first_combinable_pair
from _support.parity import assert_same_step, build_pair
from _support.resume import step_values

from trl_entropy.core.batch import OLD_ENTROPY_KEY
from trl_entropy.core.trl.objectives import LOSS_TYPES
from trl_entropy.methods import METHODS
from trl_entropy.rewards import stated_answer_reward
from trl_entropy.toy import build_chat_arithmetic_dataset


GROUP = 4  # completions per prompt in every run here
# Methods combined: the first two of the registry that combine (on different axes).
COMBINED = first_combinable_pair(list(METHODS))
# A method whose controller moves once per generation cycle: what the resume and LoRA runs train.
CYCLE_CONTROLLED = next(name for name in ADAPTIVE_METHODS if not METHODS[name].moves_per_micro_batch)
# CISPO's ε_max low enough that the noisy rollout ratios get truncated (as tests/trainer/test_loss_types.py sets it).
LOSS_OPTIONS = {"cispo": {"epsilon_high": 1.2}}
# Our loss step and TRL's sum in other orders through 30 layers. Measured on these batches (one per loss type,
# avx512): the loss differs by up to 8.7e-7 (VESPO, 1.6e-5 of it), and a gradient by up to 5.3e-5 of its tensor's
# largest entry (LUSPO; 1.5e-5 to 4.8e-5 for the others). The bounds leave a margin of 3.5 and 5.7; a gradient wrong by
# 1 % (a normaliser or a mask off by a token) is 1e-2 of it.
REAL_MODEL_LOSS_ATOL = 3e-6
REAL_MODEL_GRADIENT_SHARE = 3e-4


def graded_reward(completions: list, answer: list[str], **kwargs) -> list[float]:
    """The chat task's reward plus the completion's place in its group (0, 0.1, 0.2, 0.3): a group's rewards always
    differ, so every step has non-zero advantages. One process scores whole groups, so the place in the list is the
    place in the group."""
    correct = stated_answer_reward(completions, answer)
    return [value + 0.1 * (index % GROUP) for index, value in enumerate(correct)]


@pytest.fixture(autouse=True)
def release_the_last_tests_trainers():
    """A trainer of the real model holds about 2 GB (weights, gradients, Adam's moments) in reference cycles, which
    Python's collector may keep for many tests: collect them after each test, so that one process holds at most one
    test's trainers."""
    yield
    gc.collect()


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="module")
def chat_dataset():
    return build_chat_arithmetic_dataset(64, split="train", digits=1, seed=0)


def real_batch(model, tokenizer, seed: int, new_tokens: int = 10) -> dict:
    """A GRPO micro-batch as TRL's generation step returns it, made of real text: two chat prompts (left padded) with
    two completions each that the model samples at temperature 1, ``new_tokens`` each (its eos held back, so the
    lengths below hold whatever it samples), valid for 10, 6, 3 and 10 tokens. The rollout and reference log-probs
    are the model's own (from float64 full logits) plus noise, so the ratios fall on both sides of the clip range; the
    advantages are fixed, one of each sign per prompt."""
    from trl_entropy.toy.chat import chat_arithmetic_prompt

    prompts = [chat_arithmetic_prompt(3, "+", 4)] * 2 + [chat_arithmetic_prompt(8, "-", 5)] * 2
    encoded = tokenizer.apply_chat_template(
        prompts, add_generation_prompt=True, padding=True, return_tensors="pt", return_dict=True
    )
    prompt_ids, prompt_mask = encoded["input_ids"], encoded["attention_mask"]
    torch.manual_seed(seed)
    with torch.no_grad():
        sequences = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            min_new_tokens=new_tokens,
            max_new_tokens=new_tokens,
            pad_token_id=tokenizer.pad_token_id,
        )
    completion_ids = sequences[:, prompt_ids.size(1) :]
    lengths = torch.tensor([new_tokens, 6, 3, new_tokens])
    completion_mask = (torch.arange(new_tokens) < lengths.unsqueeze(1)).long()
    generator = torch.Generator().manual_seed(seed)
    tokens = dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids)
    log_softmax = naive_log_softmax(model, dict(tokens, completion_mask=completion_mask))
    log_probs = log_softmax.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1).float()
    entropy = -(log_softmax.exp() * log_softmax).sum(-1).float()
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.2, -1.2, -0.7, 0.7]),
        "num_items_in_batch": completion_mask.sum(),
        "old_per_token_logps": log_probs + 0.3 * torch.randn(log_probs.shape, generator=generator),
        OLD_ENTROPY_KEY: entropy,
        "ref_per_token_logps": log_probs + 0.2 * torch.randn(log_probs.shape, generator=generator),
    }


# ---------------------------------------------------------------------------------------------------------------------
# Control off: the base equals trl.GRPOTrainer, every loss type
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_base_equals_trl_on_a_real_batch(smollm2_path, tokenizer, chat_dataset, tmp_path, loss_type):
    trl_trainer, our_trainer = build_pair(
        smollm2_path,
        tokenizer,
        tmp_path,
        train_dataset=chat_dataset,
        reward_funcs=stated_answer_reward,
        loss_type=loss_type,
        beta=0.04,
        **LOSS_OPTIONS.get(loss_type, {}),
    )
    inputs = real_batch(trl_trainer.model, tokenizer, seed=LOSS_TYPES.index(loss_type))
    assert_same_step(
        trl_trainer,
        our_trainer,
        inputs,
        loss_atol=REAL_MODEL_LOSS_ATOL,
        gradient_share=REAL_MODEL_GRADIENT_SHARE,
    )


# ---------------------------------------------------------------------------------------------------------------------
# Every method trains
# ---------------------------------------------------------------------------------------------------------------------


def train_real(method, smollm2_path, chat_dataset, output_dir, **overrides):
    """Two optimizer steps of ``method`` on the real model and the chat task: 1 prompt x 4 sampled completions of at
    most 8 tokens a step, lr 1e-5; the method's options from the two-process runs (a controller that moves, two
    updates per rollout where the method acts off-policy)."""
    options = dict(
        rollout=None,  # the model samples
        reward=graded_reward,
        train_dataset=chat_dataset,
        per_device_train_batch_size=GROUP,
        num_generations=GROUP,
        max_completion_length=8,
        learning_rate=1e-5,
        max_steps=2,
    )
    options.update(overrides)
    return make_trainer(method, smollm2_path, output_dir, **options)


TRAINED = [*METHODS, COMBINED]


@pytest.mark.filterwarnings("ignore:.*on-policy")
@pytest.mark.parametrize("method", TRAINED)
def test_every_method_trains_the_real_model(smollm2_path, chat_dataset, tmp_path, method):
    trainer = train_real(method, smollm2_path, chat_dataset, str(tmp_path))
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    recorder = ControllerRecorder.attached_to(trainer)
    trainer.train()
    losses, entropies = logged(trainer, "loss"), logged(trainer, "entropy")
    assert len(losses) == 2 and all(math.isfinite(value) for value in losses + entropies), (losses, entropies)
    assert all(value > 0 for value in entropies)  # sampled at temperature 1 from a real model
    for part in method.split("+"):  # logged at every step, or once per generation batch (QAE's baseline)
        values = logged(trainer, METHOD_METRIC[part])
        assert values and all(math.isfinite(value) for value in values), (part, values)
    moved = max((p.detach() - before[name]).abs().max().item() for name, p in trainer.model.named_parameters())
    assert moved > 0, "no weight moved"
    if any(part in ADAPTIVE_METHODS for part in method.split("+")):
        assert len(recorder.values) == 2 and recorder.statistics, "no controller recorded"


# ---------------------------------------------------------------------------------------------------------------------
# Resume inside a generation cycle
# ---------------------------------------------------------------------------------------------------------------------


def test_resume_inside_a_cycle_continues_the_straight_run(smollm2_path, chat_dataset, tmp_path):
    """A method whose controller moves once per cycle (AEnt) with a LoRA adapter, whose checkpoints are small; two
    updates per rollout, so a cycle is two optimizer steps. Three steps straight, against a checkpoint at step 1
    (inside the first cycle, with its partial controller sums) and the rest resumed. Sampling draws from the restored
    random state, so the resumed run sees the same completions."""
    common = dict(
        num_iterations=2,
        max_steps=3,
        save_strategy="steps",
        save_steps=1,
        learning_rate=1e-3,
        trainer_kwargs={"peft_config": lora_config()},
    )
    straight = train_real(CYCLE_CONTROLLED, smollm2_path, chat_dataset, str(tmp_path / "straight"), **common)
    straight_recorder = ControllerRecorder.attached_to(straight)
    straight.train()
    resumed = train_real(CYCLE_CONTROLLED, smollm2_path, chat_dataset, str(tmp_path / "resumed"), **common)
    resumed_recorder = ControllerRecorder.attached_to(resumed)
    resumed.train(resume_from_checkpoint=str(tmp_path / "straight" / "checkpoint-1"))

    losses, resumed_losses = step_values(straight, "loss"), step_values(resumed, "loss")
    assert sorted(losses) == [1, 2, 3] and sorted(resumed_losses) == [1, 2, 3]  # step 1's from the checkpoint
    assert len({losses[2], losses[3]}) == 2, "identical losses: the comparison would be weak"
    for step in (2, 3):
        assert resumed_losses[step] == pytest.approx(losses[step], rel=1e-5, abs=1e-7), step
        assert step_values(resumed, "entropy")[step] == pytest.approx(step_values(straight, "entropy")[step], rel=1e-5)
    # The controller updates at the end of the first cycle (step 2) from the entropy summed over steps 1 and 2; the
    # resumed run took step 1's half from the checkpoint.
    (straight_statistics,) = straight_recorder.statistics.values()
    (resumed_statistics,) = resumed_recorder.statistics.values()
    assert len(straight_statistics) == 1 and len(resumed_statistics) == 1
    assert resumed_statistics == pytest.approx(straight_statistics, rel=1e-6)
    assert resumed_recorder.values == pytest.approx(straight_recorder.values[1:], rel=1e-6)
    for (name, weight), other in zip(straight.model.named_parameters(), resumed.model.parameters(), strict=True):
        torch.testing.assert_close(other, weight, rtol=1e-5, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------------------------------------------------
# LoRA
# ---------------------------------------------------------------------------------------------------------------------


def test_lora_trains_only_the_adapter_of_the_real_model(smollm2_path, chat_dataset, tokenizer, tmp_path):
    """A method with a controller (AEnt) trains the adapter alone (lr 1e-3, two steps), and the entropy head scores
    through it: the trainer's log-probs are the adapted model's full-logit ones, not the base model's."""
    from transformers import AutoModelForCausalLM

    trainer = train_real(
        CYCLE_CONTROLLED,
        smollm2_path,
        chat_dataset,
        str(tmp_path),
        learning_rate=1e-3,
        trainer_kwargs={"peft_config": lora_config()},
    )
    model = trainer.model
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable), sorted(trainable)[:5]
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer.train()
    moved = {name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])}
    assert moved and moved <= trainable, sorted(moved - trainable)[:5]
    metric = METHOD_METRIC[CYCLE_CONTROLLED]
    assert all(math.isfinite(value) for value in logged(trainer, "loss") + logged(trainer, metric))

    model.eval()
    inputs = real_batch(model, tokenizer, seed=0, new_tokens=6)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention_mask = torch.cat([inputs["prompt_mask"], torch.ones_like(inputs["completion_ids"])], 1)
    with torch.no_grad():
        scored = trainer.score_tokens(model, input_ids, attention_mask, 6).log_probs
    adapted = full_logit_log_probs(model, input_ids, attention_mask, 6)
    base = full_logit_log_probs(
        AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32), input_ids, attention_mask, 6
    )
    torch.testing.assert_close(scored.double(), adapted, rtol=1e-4, atol=1e-4)
    assert (base - adapted).abs().max() > 1e-3, "the adapter changes nothing: the comparison would be vacuous"
