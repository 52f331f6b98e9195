"""Every loss type of trl.GRPOTrainer 1.16, every method with every loss type, ``args=None`` and remote-code models.

* With control off, ``EntropyGRPOTrainer`` equals ``trl.GRPOTrainer`` for CISPO, SAPO, LUSPO and VESPO (loss,
  gradients, metrics), and each loss equals its paper's formula written out here in float64.
* The method × loss-type table of docs/loss_types.md, one test per cell: a supported pair with the method's control
  neutralised equals ``trl.GRPOTrainer`` with that loss type; a refused pair names the method, the loss type and why.
* ``args=None`` builds the method's config named after the model; ``trust_remote_code`` is read from both places TRL
  reads it.
"""

import json
import os
import re
from pathlib import Path

import pytest
import torch
from _reference.float64_policy import assert_step_is_float64, completion_log_probs, float64_model
from _support.grpo import build_trainer, loss_and_gradients, make_grpo_batch, toy_dataset
from _support.parity import TRL, assert_same_step, build_pair
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

from trl_entropy.core.trl.objectives import LOSS_TYPES, PPO_CLIP_LOSS_TYPES
from trl_entropy.methods import METHODS, SPECS
from trl_entropy.toy import build_toy_model, toy_reward


ROOT = Path(__file__).resolve().parents[2]
NEW_LOSS_TYPES = ("cispo", "sapo", "luspo", "vespo")
# CISPO's ε_max low enough that the noisy rollout ratios (exp(±0.3)) get truncated: the truncation is exercised.
LOSS_OPTIONS = {"cispo": {"epsilon_high": 1.2}, "sapo": {}, "luspo": {}, "vespo": {}}
# The metrics TRL logs for each loss type besides "entropy" (and "kl" when beta > 0).
LOSS_METRICS = {
    "cispo": ("cispo_clip_ratio",),
    "sapo": (),
    "luspo": ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"),
    "vespo": ("vespo/phi_seq_mean",),
}
PARITY_CASES = [
    (loss, beta, level) for loss in NEW_LOSS_TYPES for beta in (0.0, 0.04) for level in ("token", "sequence")
]


# ---------------------------------------------------------------------------------------------------------------------
# The four newer loss types against trl.GRPOTrainer
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type, beta, level", PARITY_CASES)
def test_new_loss_types_equal_grpo_trainer(toy_model_path, toy_tokenizer, tmp_path, loss_type, beta, level):
    trl_trainer, our_trainer = build_pair(
        toy_model_path,
        toy_tokenizer,
        tmp_path,
        loss_type=loss_type,
        beta=beta,
        importance_sampling_level=level,
        **LOSS_OPTIONS[loss_type],
    )
    inputs = make_grpo_batch(trl_trainer.model, len(toy_tokenizer), seed=PARITY_CASES.index((loss_type, beta, level)))
    assert_same_step(trl_trainer, our_trainer, inputs)
    trl_metrics, our_metrics = trl_trainer._metrics["train"], our_trainer._metrics["train"]
    for key in ("entropy",) + LOSS_METRICS[loss_type] + (("kl",) if beta else ()):
        assert our_metrics[key] == pytest.approx(trl_metrics[key], rel=1e-5, abs=1e-7), key
    # No metric of another loss type's clip: the keys TRL logs, plus ours (entropy/cov_logp_adv).
    assert set(our_metrics) - {"entropy/cov_logp_adv"} == set(trl_metrics)
    if loss_type == "cispo" and level == "token":
        assert 0 < trl_metrics["cispo_clip_ratio"][0] < 1, "no ratio truncated: the case tests nothing"


# ---------------------------------------------------------------------------------------------------------------------
# Each loss type against its paper's formula, in float64
# ---------------------------------------------------------------------------------------------------------------------


def paper_loss(loss_type, log_probs, old_log_probs, advantages, mask, config):
    """The loss of one micro-batch (no accumulation), written from each paper; ``log_probs`` ``(B, T)`` float64."""
    A = advantages.unsqueeze(1)
    lengths = mask.sum(-1)
    log_r = log_probs - old_log_probs
    r = torch.exp(log_r)
    if loss_type == "cispo":  # MiniMax-M1 (arXiv:2506.13585) eq. 4, upper truncation at ε_max (ScaleRL, 2510.13786)
        weight = torch.minimum(r, torch.tensor(config.epsilon_high, dtype=r.dtype)).detach()
        return -(weight * A * log_probs * mask).sum() / mask.sum()
    if loss_type == "sapo":  # SAPO (arXiv:2511.20347) eqs. 5-6: gate f(r) = σ(τ(r−1))·4/τ, τ by the sign of A
        tau = torch.where(A > 0, config.sapo_temperature_pos, config.sapo_temperature_neg).double()
        gate = torch.sigmoid(tau * (r - 1)) * 4 / tau
        return -(((gate * A) * mask).sum(-1) / lengths).mean()
    if loss_type == "luspo":  # LUSPO (arXiv:2602.05261): GSPO's clipped sequence objective scaled by the length |o_i|
        s = torch.exp((log_r * mask).sum(-1) / lengths)
        low, high = 1 - config.epsilon, 1 + (config.epsilon_high or config.epsilon)
        clipped = torch.minimum(s * advantages, s.clamp(low, high) * advantages)
        return -(lengths * clipped).mean()
    if loss_type == "vespo":  # VESPO (arXiv:2602.10693): φ(w) = e^λ·w^k·e^{−λw}, w = Π_t r_t, (k, λ) by the sign of A
        w = torch.exp((log_r * mask).sum(-1)).detach()
        positive = advantages >= 0
        k = torch.where(positive, config.vespo_k_pos, config.vespo_k_neg).double()
        lam = torch.where(positive, config.vespo_lambda_pos, config.vespo_lambda_neg).double()
        phi = torch.exp(lam) * w**k * torch.exp(-lam * w)
        return -((phi * advantages).unsqueeze(1) * log_probs * mask).sum() / mask.sum()
    raise AssertionError(loss_type)


@pytest.mark.parametrize("loss_type", NEW_LOSS_TYPES)
def test_new_loss_types_equal_paper_formula(toy_model_path, toy_tokenizer, loss_type, toy_trainer_of):
    level = "sequence" if loss_type == "luspo" else "token"  # each paper's own setting
    options = {**LOSS_OPTIONS[loss_type], "epsilon_high": 1.2 if loss_type == "cispo" else 0.28}
    trainer = toy_trainer_of("grpo", loss_type=loss_type, importance_sampling_level=level, **options)
    inputs = make_grpo_batch(trainer.model, len(toy_tokenizer), seed=7, old_noise=0.3)
    our_loss, our_grads = loss_and_gradients(trainer, inputs)

    reference = float64_model(toy_model_path)
    log_probs = completion_log_probs(reference, inputs)
    mask = inputs["completion_mask"].double()
    loss = paper_loss(
        loss_type, log_probs, inputs["old_per_token_logps"].double(), inputs["advantages"].double(), mask, trainer.args
    )
    assert_step_is_float64(our_loss, our_grads, loss, reference)


# ---------------------------------------------------------------------------------------------------------------------
# Method × loss type: every cell of docs/loss_types.md
# ---------------------------------------------------------------------------------------------------------------------


def documented_refusals() -> set[tuple[str, str]]:
    """The cells docs/loss_types.md marks refused, as (method, loss type); a row names a method by its display name
    (``MethodSpec.name``, GRPO for the base) or a variant of it (``REPO-R``)."""
    lines = (ROOT / "docs" / "loss_types.md").read_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| method |"))
    loss_types = [cell.strip() for cell in lines[header].strip("|").split("|")][1:]
    rows = {}
    for line in lines[header + 2 :]:
        if not line.startswith("|"):
            break
        label, *cells = (cell.strip() for cell in line.strip("|").split("|"))
        rows[re.sub(r"\(.*\)", "", label)] = dict(zip(loss_types, cells, strict=True))
    refused = set()
    for spec in SPECS:
        shown = spec.name or "GRPO"
        row = [
            cells
            for label, cells in rows.items()
            if any(part == shown or part.startswith(f"{shown}-") for part in map(str.strip, label.split(",")))
        ]
        assert len(row) == 1, f"docs/loss_types.md has {len(row)} rows for {shown}"
        refused |= {(name, t) for name in spec.entries() for t, cell in row[0].items() if cell.startswith("refused")}
    return refused


REFUSED = documented_refusals()
REFUSAL_REASONS = {"cispo": "epsilon_max", "sapo": "sigmoid gate", "vespo": "gamma weight"}
CELLS = [(method, loss_type) for method in METHODS for loss_type in LOSS_TYPES]


def test_table_matches_configs():
    """The refused cells are exactly those the configs refuse; every other cell is supported."""
    for method, loss_type in CELLS:
        supported = loss_type in METHODS[method].config_class.supported_loss_types
        assert supported == ((method, loss_type) not in REFUSED), (method, loss_type)


@pytest.mark.parametrize("method, loss_type", CELLS)
def test_method_with_loss_type(toy_tokenizer, tmp_path, cached_trl_trainer, method, loss_type, toy_trainer_of):
    spec = METHODS[method]
    options = {**spec.defaults, "loss_type": loss_type}
    if (method, loss_type) in REFUSED:
        name = spec.config_class.__name__.removesuffix("Config")
        refusal = rf"{name} does not support loss_type='{loss_type}': .*{REFUSAL_REASONS[loss_type]}"
        with pytest.raises(ValueError, match=refusal):
            spec.config_class(output_dir=str(tmp_path), use_cpu=True, bf16=False, **options)
        return
    # The method with its control neutralised, and the trl.GRPOTrainer options it then equals.
    ours_options, trl_options = spec.neutral.ours, spec.neutral.trl_options(loss_type in PPO_CLIP_LOSS_TYPES)
    trl_options = {**LOSS_OPTIONS.get(loss_type, {}), **trl_options}
    if loss_type == "cispo":
        ours_options = {**LOSS_OPTIONS["cispo"], **ours_options}
    ours = toy_trainer_of(method, **options, **ours_options)
    trl = cached_trl_trainer(loss_type=loss_type, **trl_options)
    inputs = make_grpo_batch(trl.model, len(toy_tokenizer), seed=CELLS.index((method, loss_type)), old_noise=0.3)
    assert_same_step(trl, ours, inputs)


# ---------------------------------------------------------------------------------------------------------------------
# args=None and trust_remote_code
# ---------------------------------------------------------------------------------------------------------------------

TRAINERS = {spec.trainer_class: spec.config_class for spec in METHODS.values()}


@pytest.mark.parametrize("by_name", [True, False], ids=["name", "instance"])
def test_args_none_builds_the_methods_default_config(toy_model_path, toy_tokenizer, tmp_path, monkeypatch, by_name):
    """As trl.GRPOTrainer: the default config named after the model (then the method, where TRL writes "GRPO")."""
    # GRPOConfig's defaults ask for bf16, which transformers refuses on a machine without a bf16 GPU.
    monkeypatch.setattr("transformers.training_args.is_torch_bf16_gpu_available", lambda: True)
    monkeypatch.chdir(tmp_path)
    model = toy_model_path if by_name else AutoModelForCausalLM.from_pretrained(toy_model_path)
    model_name = os.path.basename(toy_model_path)
    common = dict(reward_funcs=toy_reward, train_dataset=toy_dataset(8), processing_class=toy_tokenizer)
    reference = GRPOTrainer(model=model, **common).args
    assert reference.output_dir == f"{model_name}-GRPO"
    for trainer_class, config_class in TRAINERS.items():
        args = trainer_class(model=model, **common).args
        assert type(args) is config_class
        assert args.output_dir == f"{model_name}-{trainer_class.__name__.removesuffix('Trainer')}"
        # Every GRPOConfig field the method does not set itself is TRL's default.
        trl_fields = GRPOConfig.__dataclass_fields__
        own = {name for name, f in trl_fields.items() if config_class.__dataclass_fields__[name] is not f}
        for name in set(trl_fields) - {"output_dir", "logging_dir"} - own:
            assert getattr(args, name) == getattr(reference, name), (trainer_class.__name__, name)


def write_remote_code_model(folder, tokenizer):
    """A tiny model with its own configuration and modelling files, loadable only with trust_remote_code=True."""
    build_toy_model(tokenizer, seed=0).save_pretrained(folder)
    (folder / "configuration_tiny_remote.py").write_text(
        "from transformers import LlamaConfig\n\n\n"
        "class TinyRemoteConfig(LlamaConfig):\n"
        '    model_type = "tiny_remote"\n'
    )
    (folder / "modeling_tiny_remote.py").write_text(
        "from transformers import LlamaForCausalLM\n\n"
        "from .configuration_tiny_remote import TinyRemoteConfig\n\n\n"
        "class TinyRemoteForCausalLM(LlamaForCausalLM):\n"
        "    config_class = TinyRemoteConfig\n"
    )
    config = json.loads((folder / "config.json").read_text())
    config.update(
        model_type="tiny_remote",
        architectures=["TinyRemoteForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_tiny_remote.TinyRemoteConfig",
            "AutoModelForCausalLM": "modeling_tiny_remote.TinyRemoteForCausalLM",
        },
    )
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.fixture(scope="module")
def remote_code_model_path(tmp_path_factory, toy_tokenizer):
    return write_remote_code_model(tmp_path_factory.mktemp("remote_code_model"), toy_tokenizer)


TRUST_PLACES = {
    "config": {"trust_remote_code": True},
    "model_init_kwargs": {"model_init_kwargs": {"trust_remote_code": True}},
}


@pytest.mark.parametrize("place", TRUST_PLACES)
def test_remote_code_model_by_name(remote_code_model_path, toy_tokenizer, tmp_path, place):
    """Every trainer loads a remote-code model by name with trust_remote_code in either place TRL reads it, and the
    base's loss step equals trl.GRPOTrainer's on it."""
    options = TRUST_PLACES[place]
    for method in (next(iter(spec.entries())) for spec in SPECS):  # each trainer once
        trainer = build_trainer(method, remote_code_model_path, toy_tokenizer, tmp_path / method, **options)
        assert type(trainer.model).__name__ == "TinyRemoteForCausalLM"
    trl_trainer = build_trainer(TRL, remote_code_model_path, toy_tokenizer, tmp_path / "trl", **options)
    our_trainer = build_trainer("grpo", remote_code_model_path, toy_tokenizer, tmp_path / "ours", **options)
    assert_same_step(trl_trainer, our_trainer, make_grpo_batch(trl_trainer.model, len(toy_tokenizer), seed=11))


def test_model_init_kwargs_win_over_the_config(remote_code_model_path, toy_tokenizer, tmp_path):
    """As in TRL, model_init_kwargs' trust_remote_code=False overrides the config's True: both refuse the model."""
    options = {"trust_remote_code": True, "model_init_kwargs": {"trust_remote_code": False}}
    for method in (TRL, "grpo"):
        with pytest.raises(ValueError, match="trust_remote_code"):
            build_trainer(method, remote_code_model_path, toy_tokenizer, tmp_path, **options)
