"""vLLM through a stand-in: the trainers take ``use_vllm=True`` (server and colocate modes) and keep TRL's
importance-sampling correction.

Server mode cannot run on a CPU, and the main environment has no vLLM, so here TRL's ``VLLMGeneration`` is replaced by
:class:`FakeVLLM`: it takes the same arguments, and "samples" deterministic completions whose sampling log-probs are
the policy's own (float64, full logits) plus a fixed perturbation, the mismatch between vLLM and the trainer that the
correction exists for. Everything else is TRL's vLLM path: weight syncs, the old log-probs computed for the correction
(by our kernel), the importance-sampling ratio in its four modes, and the loss. tests/real_vllm/ runs a real engine
(vLLM's CPU build, colocate mode)."""

import math
import types
from types import SimpleNamespace

import pytest
import torch
import trl.trainer.grpo_trainer
from _support.distributed_run import logged, make_trainer, rollout_text
from _support.grpo import make_grpo_batch
from trl import GRPOConfig, GRPOTrainer

from trl_entropy import EntropyGRPOConfig, EntropyGRPOTrainer
from trl_entropy.core.trl import bridge
from trl_entropy.core.trl import vllm as vllm_support
from trl_entropy.methods import METHODS, get_method
from trl_entropy.toy import build_toy_dataset, toy_reward


MODES = ("server", "colocate")
IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def perturbation(position: int, token: int) -> float:
    """The fixed gap between the 'vLLM' sampling log-prob and the trainer's, per completion token."""
    return 0.15 * math.cos(1.7 * position + 0.3 * token)


class FakeVLLM:
    """Stands in for ``trl.generation.vllm_generation.VLLMGeneration`` (same constructor, same ``generate``)."""

    instances: list["FakeVLLM"] = []

    def __init__(self, model, accelerator, processing_class, mode, **options):
        self.model, self.tokenizer, self.mode, self.options = model, processing_class, mode, options
        self.syncs = 0
        # Server mode asks the server how it computes log-probs.
        self.vllm_client = SimpleNamespace(
            get_server_info=lambda: {"model_config": {"logprobs_mode": "processed_logprobs"}}
        )
        FakeVLLM.instances.append(self)

    def sync_weights(self):
        self.syncs += 1

    def generate(self, prompts, images, num_generations, profiler=None):
        seen = {}
        completion_ids, logprobs = [], []
        for prompt in prompts:
            key = tuple(prompt)
            copy = seen[key] = seen.get(key, -1) + 1
            text = rollout_text(self.tokenizer.decode(prompt), copy)
            completion = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            with torch.no_grad():
                logits = self.model(input_ids=torch.tensor([prompt + completion])).logits[0].double()
            log_probs = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)
            sampled = log_probs.gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1).tolist()
            completion_ids.append(completion)
            logprobs.append([[lp + perturbation(t, tok)] for t, (lp, tok) in enumerate(zip(sampled, completion))])
        return prompts, completion_ids, logprobs, None


@pytest.fixture
def fake_vllm(monkeypatch):
    """The stand-in in place of TRL's backend. The checks of a real engine's environment (vLLM installed, its CPU
    platform, server mode on a CPU) do not apply to it: tests/real_vllm/ runs them against a real engine."""
    FakeVLLM.instances = []
    monkeypatch.setattr(trl.trainer.grpo_trainer, "VLLMGeneration", FakeVLLM)
    monkeypatch.setattr(bridge, "check_vllm_arguments", lambda args, model: None)
    monkeypatch.setattr(bridge, "vllm_on_cpu", lambda: False)
    return FakeVLLM


# ---------------------------------------------------------------------------------------------------------------------
# Configs and construction
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_config_accepts_use_vllm(method, mode):
    spec = get_method(method)
    args = spec.config_class(
        output_dir="unused", report_to=[], use_cpu=True, use_vllm=True, vllm_mode=mode, **spec.defaults
    )
    assert args.use_vllm and args.vllm_mode == mode and args.vllm_importance_sampling_correction


def test_without_vllm_installed_the_error_names_both_installs(warm_toy_policy_path, tmp_path, monkeypatch):
    """Refused before TRL loads anything, with the install for a GPU and the one for a CPU."""
    monkeypatch.setattr(vllm_support, "is_vllm_available", lambda: False)
    with pytest.raises(ImportError, match=r"use_vllm=True needs vLLM.*\.\[vllm\].*vLLM on a CPU"):
        make_trainer("aent", warm_toy_policy_path, str(tmp_path), rollout=None, use_vllm=True, vllm_mode="colocate")


# ---------------------------------------------------------------------------------------------------------------------
# Training through TRL's vLLM path
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("method", sorted(METHODS))
def test_training_with_vllm(method, mode, fake_vllm, warm_toy_policy_path, tmp_path):
    trainer = make_trainer(
        method, warm_toy_policy_path, str(tmp_path), rollout=None, use_vllm=True, vllm_mode=mode, max_steps=2
    )
    (backend,) = fake_vllm.instances
    assert backend.mode == mode and backend.options["logprobs"] == 0
    trainer.train()
    generations = math.ceil(2 / trainer.args.num_iterations)  # KL-Cov's options reuse each rollout twice
    assert backend.syncs == generations  # the weights go to vLLM before each generation
    ratios = logged(trainer, "sampling/importance_sampling_ratio/mean")
    assert len(ratios) == generations and all(math.isfinite(r) and abs(r - 1) > 1e-3 for r in ratios)
    assert all(math.isfinite(loss) for loss in logged(trainer, "loss"))
    for controller in trainer.controllers.values():
        for key in controller.metrics():
            values = logged(trainer, key)
            assert len(values) == 2 and all(math.isfinite(v) for v in values), key


@pytest.mark.parametrize("is_mode", IS_MODES)
def test_importance_sampling_ratio_and_loss_equal_grpo_trainers(is_mode, fake_vllm, warm_toy_policy_path, tmp_path):
    """On the same 'vLLM' completions, ours computes TRL's correction ratio and TRL's corrected loss and gradients."""
    common = dict(
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        report_to=[],
        use_cpu=True,
        bf16=False,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_importance_sampling_mode=is_mode,
        vllm_importance_sampling_clip_max=1.1,  # tight enough for the truncation or the mask to act
        vllm_importance_sampling_clip_min=0.9 if is_mode.endswith("mask") else None,
        loss_type="grpo",
        beta=0.04,
    )
    trainers = []
    for trainer_class, config_class in ((GRPOTrainer, GRPOConfig), (EntropyGRPOTrainer, EntropyGRPOConfig)):
        trainer = trainer_class(
            model=warm_toy_policy_path,
            reward_funcs=toy_reward,
            args=config_class(output_dir=str(tmp_path / trainer_class.__name__), **common),
            train_dataset=build_toy_dataset(8),
        )
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        trainers.append(trainer)
    rows = [build_toy_dataset(8)[i] for i in (0, 0, 0, 0, 1, 1, 1, 1)]
    batches = [t._generate_and_score_completions([dict(r) for r in rows]) for t in trainers]
    reference, ours = batches
    ratio = ours["importance_sampling_ratio"]
    torch.testing.assert_close(ratio, reference["importance_sampling_ratio"], rtol=1e-5, atol=1e-6)
    assert ratio.shape[1] == (1 if is_mode.startswith("sequence") else ours["completion_ids"].size(1))
    clipped = (ratio == 0) if is_mode.endswith("mask") else (ratio == 1.1)
    assert clipped.any() and (ratio != 1).any()
    results = []
    for trainer in trainers:  # both trainers score the same batch (TRL's)
        trainer.model.zero_grad(set_to_none=True)
        loss = trainer.compute_loss(trainer.model, dict(reference))
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters()}))
    (trl_loss, trl_grads), (our_loss, our_grads) = results
    torch.testing.assert_close(our_loss, trl_loss, rtol=1e-5, atol=1e-7)
    for name in trl_grads:
        # Two fused kernels sum in different orders: an entry near zero of a gradient whose largest entries are ~0.2
        # can differ by a few fp32 roundings of those (2.6e-7 measured on token_mask), hence an absolute floor of 1e-6.
        torch.testing.assert_close(our_grads[name], trl_grads[name], rtol=1e-4, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------------------------------------------------
# The correction multiplies each method's policy term
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sequence_level", [False, True])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_correction_scales_each_methods_policy_term(method, sequence_level, toy_model_path, toy_tokenizer, tmp_path):
    """``use_vllm`` multiplies the per-token policy loss by the ratio (after the masks), before the KL and bonuses.

    The expected loss is the method's own loss without vLLM, with its per-token loss after its gates multiplied by
    the ratio: exactly what ``trl.GRPOTrainer`` does to its surrogate.
    """
    trainer = make_trainer(method, toy_model_path, str(tmp_path), rollout=None, beta=0.04)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs = make_grpo_batch(trainer.model, len(toy_tokenizer), batch=4, seed=21)
    generator = torch.Generator().manual_seed(3)
    shape = (4, 1) if sequence_level else inputs["completion_ids"].shape
    inputs["importance_sampling_ratio"] = 0.5 + torch.rand(shape, generator=generator)
    inputs["sampling_per_token_logps"] = inputs["old_per_token_logps"] + 0.1
    controllers = {name: c.state_dict() for name, c in trainer.controllers.items()}
    # A method that draws tokens at random draws the same ones each time
    generators = next((part.generators for part in trainer.parts if hasattr(part, "generators")), {})
    generator_states = {mode: g.get_state() for mode, g in generators.items()}
    method_gates = type(trainer).apply_gates

    def loss(use_vllm, gates=method_gates):
        for name, controller in trainer.controllers.items():
            controller.load_state_dict(controllers[name])  # every loss sees the same controller value
        for mode, g in generators.items():
            g.set_state(generator_states[mode])
        trainer.use_vllm, trainer.vllm_importance_sampling_correction = use_vllm, True
        trainer.apply_gates = types.MethodType(gates, trainer)
        return trainer.compute_loss(trainer.model, dict(inputs)).item()

    def corrected(self, batch, ratio, advantages, per_token_loss, step_inputs, metrics):
        gated = method_gates(self, batch, ratio, advantages, per_token_loss, step_inputs, metrics)
        return gated * inputs["importance_sampling_ratio"]

    with_vllm = loss(True)
    assert with_vllm == pytest.approx(loss(False, corrected), rel=1e-6, abs=1e-8)
    assert with_vllm != pytest.approx(loss(False), rel=1e-4)  # the correction does change the loss
