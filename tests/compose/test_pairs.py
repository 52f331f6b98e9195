"""Every pair of methods: its loss and every gradient against a float64 loss step written from the papers' formulas
(``_reference/combined_reference.py``), applied in the axis order; every refused pair's message; the loss types each
pair accepts and the refusal naming the method that refuses the rest.

The batch is built so that every component acts with margins far above rounding: the old log-probs are the model's own
minus ``log RATIOS`` (tokens on both sides of the clip, with either sign of advantage), the rollout entropies the
model's own divided by ``ENTROPY_RATIOS`` (tokens inside and outside ERC's band), and the thresholds that select tokens
(Clip-Cov's lower bound, KL-Cov's share, EntroPIC's probability) are set in the middle of the widest gap between the
batch's own values.
"""

import itertools
import math
import warnings

import pytest
import torch
from _reference import combined_reference as reference
from _support.grpo import build_trainer, loss_and_gradients, make_grpo_batch, toy_config
from transformers import AutoModelForCausalLM

from trl_entropy import EntropyGRPOConfig, EntropyGRPOTrainer
from trl_entropy.core.trl.objectives import LOSS_TYPES
from trl_entropy.methods import METHODS, combination
from trl_entropy.methods.compose import controls_entropy
from trl_entropy.methods.spec import Place


NAMES = [name for name, entry in METHODS.items() if controls_entropy(entry)]
PAIRS = list(itertools.combinations(NAMES, 2))
# Written out from the axes (docs/composing.md), not read from the code: the pairs refused, with what the message says.
SAME_AXIS = {
    "group baseline": ("qae", "entrocraft"),
    "per-token advantage": ("repo_r", "repo_d", "ent_adv"),
    "surrogate": ("kl_cov", "ce_gppo"),
    "entropy regulariser": ("entreg", "aent", "entropic", "siren"),
}
NO_CLIP = {("clip_cov", "kl_cov"), ("kl_cov", "adapo")}
REFUSED = {
    **{
        pair: f"both act on the {axis}"
        for axis, names in SAME_AXIS.items()
        for pair in itertools.combinations(names, 2)
    },
    **{pair: "replaces that clip by its own surrogate" for pair in NO_CLIP},
    # Two names of one method, each standing for another variant.
    ("entrocraft", "entrocraft_sign"): "set entrocraft_variant to different defaults",
}
VALID = [pair for pair in PAIRS if pair not in REFUSED]

REWARDS = torch.tensor([1.0, 0.0, 1.0, 0.25])  # advantages +, −, +, − under both the mean and QAE's 0.4-quantile
RATIOS = torch.tensor(
    [
        [1.5, 1.1, 0.5, 2.0, 0.95, 1.4],
        [0.5, 1.3, 1.1, 0.6, 1.5, 0.7],
        [1.6, 0.5, 1.35, 1.0, 1.0, 1.0],
        [0.3, 0.7, 1.5, 0.9, 0.85, 1.25],
    ]
)
ENTROPY_RATIOS = torch.tensor(
    [
        [1.0, 1.2, 0.9, 1.01, 1.0, 0.8],
        [0.7, 1.02, 1.3, 1.0, 1.0, 1.0],
        [1.2, 1.0, 1.0, 1.0, 1.0, 1.0],
        [0.98, 1.0, 0.85, 1.1, 1.03, 1.0],
    ]
)
SETTINGS = dict(
    loss_type="dapo",
    epsilon=0.2,
    epsilon_high=0.28,
    beta=0.0,
    qae_quantile_k=0.4,
    repo_beta=0.5,
    repo_beta_max=1.0,
    ent_adv_alpha=0.4,
    ent_adv_kappa=2.0,
    ce_gppo_beta1=0.5,
    ce_gppo_beta2=1.0,
    kl_cov_coef=1.0,
    clip_cov_ratio=1.0,  # every candidate is detached: the choice among them is random
    clip_cov_ub=100.0,
    erc_low=0.95,
    erc_high=1.05,
    steer_weight_min=0.8,
    # Entrocraft's band [0, 0]: every batch's entropy is above it, so the negative rollouts are rejected.
    entrocraft_shape="fixed",
    entrocraft_lower_start=0.0,
    entrocraft_upper_start=0.0,
    entropy_coef=0.1,
    aent_coef_init=0.1,
    aent_coef_max=1.0,
    aent_clamp_fraction=0.3,
    siren_coef=0.5,
    siren_top_p=0.5,
    siren_top_k=20,
    siren_mask_ratio=0.5,
    siren_anchor=0.3,
    entropic_kp=0.5,
    entropic_target=0.1,
)


# The places that act once per generation batch, from the rewards: the trainer's generation tail applies them.
GENERATION_PLACES = {Place.GROUP_BASELINE, Place.ROLLOUT_REJECTION}


def widest_gap(values: torch.Tensor) -> tuple[float, int]:
    """The middle of the widest gap between the sorted middle half of ``values``, and how many values lie above it."""
    ordered = values.sort(descending=True).values
    quarter = len(ordered) // 4
    gaps = ordered[quarter : -quarter - 1] - ordered[quarter + 1 : len(ordered) - quarter]
    index = quarter + int(gaps.argmax())
    return float((ordered[index] + ordered[index + 1]) / 2), index + 1


@pytest.fixture(scope="module")
def float64_model(toy_model_path):
    return AutoModelForCausalLM.from_pretrained(toy_model_path, dtype=torch.float64)


@pytest.fixture(scope="module")
def batch(float64_model, toy_tokenizer):
    inputs = make_grpo_batch(float64_model, len(toy_tokenizer), seed=3)
    with torch.no_grad():
        log_probs, entropy, _ = reference.scores(float64_model, inputs)
    inputs["old_per_token_logps"] = (log_probs - RATIOS.double().log()).float()
    inputs["old_entropy"] = (entropy / ENTROPY_RATIOS.double()).float()
    return inputs


def thresholds(model, inputs, names) -> dict:
    """Clip-Cov's lower bound, KL-Cov's share and EntroPIC's probability threshold, each in the widest gap of the
    batch's own values (the covariances with the pair's token advantages, the token probabilities)."""
    with torch.no_grad():
        log_probs, entropy, _ = reference.scores(model, inputs)
        advantages = reference.group_advantages(REWARDS, names, SETTINGS)
        advantages = reference.token_advantages(advantages, log_probs, entropy, names, SETTINGS)
    valid = inputs["completion_mask"].bool()
    cov = reference.covariance(log_probs, advantages, valid.double())[valid]
    clip_cov_lb, _ = widest_gap(cov)
    _, above = widest_gap(cov)
    probability, _ = widest_gap(log_probs[valid].exp())
    return dict(clip_cov_lb=clip_cov_lb, kl_cov_ratio=(above + 0.5) / int(valid.sum()), entropic_high_prob=probability)


def options_of(names, chosen: dict) -> dict:
    """The settings of the selected methods (TRL's entropy bonus for entreg) and TRL's own."""
    fields = {key for name in names for key in METHODS[name].config_class.__dataclass_fields__}
    options = {key: value for key, value in {**SETTINGS, **chosen}.items() if key in fields}
    return options if "entreg" in names else {key: value for key, value in options.items() if key != "entropy_coef"}


def test_the_table_covers_every_pair_of_the_registry():
    assert set(REFUSED) <= set(PAIRS) and len(VALID) + len(REFUSED) == len(PAIRS) == math.comb(len(NAMES), 2)


@pytest.mark.filterwarnings("ignore:.*on-policy")
@pytest.mark.parametrize("names", VALID, ids="+".join)
def test_one_loss_step_equals_the_float64_components_in_axis_order(
    names, float64_model, batch, toy_model_path, toy_tokenizer, tmp_path
):
    chosen = thresholds(float64_model, batch, names)
    options = options_of(names, chosen)
    config_class = combination(list(names)).config_class
    trainer = build_trainer(
        EntropyGRPOTrainer,
        config_class,
        toy_model_path,
        toy_tokenizer,
        tmp_path,
        entropy_control=list(names),
        **options,
    )
    assert type(trainer) is combination(list(names)).trainer_class
    inputs = dict(batch)
    inputs["advantages"] = reference.group_advantages(REWARDS, (), SETTINGS).squeeze(1).float()  # TRL's, made by TRL
    if any(set(METHODS[name].acts_on) & GENERATION_PLACES for name in names):  # through the generation tail
        trainer.on_rewards(REWARDS.unsqueeze(1))
        inputs = trainer.finish_generation_batch(inputs, rows=len(REWARDS))
    our_loss, our_grads = loss_and_gradients(trainer, inputs)

    float64_model.zero_grad(set_to_none=True)
    loss = reference.combined_loss(float64_model, inputs, REWARDS, names, {**SETTINGS, **chosen})
    loss.backward()
    torch.testing.assert_close(our_loss.double(), loss.detach(), rtol=1e-5, atol=1e-7)
    assert any(p.grad.abs().max() > 0 for p in float64_model.parameters())
    for name, parameter in float64_model.named_parameters():
        expected = parameter.grad
        atol = max(1e-7, 1e-5 * expected.abs().max().item())
        torch.testing.assert_close(our_grads[name].double(), expected, rtol=1e-4, atol=atol, msg=name)
    logged = set(trainer._metrics["train"])
    for name in names:  # each method logs under its own prefix
        prefixes = {metric.key.split("/")[0] for metric in METHODS[name].metrics}
        assert any(key.split("/")[0] in prefixes for key in logged), (name, sorted(logged))


@pytest.mark.parametrize(("pair", "message"), sorted(REFUSED.items()), ids=lambda value: "+".join(value))
def test_a_refused_pair_names_both_methods_and_why(pair, message, tmp_path):
    for order in (pair, pair[::-1]):
        with pytest.raises(ValueError, match=message) as refusal:
            EntropyGRPOConfig(output_dir=str(tmp_path), use_cpu=True, entropy_control=list(order))
        assert all(repr(name) in str(refusal.value) for name in pair)


@pytest.mark.filterwarnings("ignore:.*on-policy")
@pytest.mark.parametrize("names", VALID, ids="+".join)
def test_a_pair_takes_the_loss_types_both_methods_take_and_names_the_one_that_refuses(names, tmp_path):
    alone = {name: METHODS[name].config_class.supported_loss_types for name in names}
    for loss_type in LOSS_TYPES:
        refusing = [name for name in names if loss_type not in alone[name]]
        options = dict(output_dir=str(tmp_path), use_cpu=True, entropy_control=list(names), loss_type=loss_type)
        if not refusing:
            assert EntropyGRPOConfig(**options).loss_type == loss_type
            continue
        with pytest.raises(ValueError, match=rf"^({'|'.join(refusing)}) does not support loss_type='{loss_type}'"):
            EntropyGRPOConfig(**options)


def test_a_pairs_config_declares_only_the_loss_types_both_methods_take(tmp_path):
    """The public ``supported_loss_types`` of each valid pair's config: the loss types both methods' configs take, read
    from the registry here (a union would still be refused at construction, by another path, while the attribute
    lied)."""
    narrowed = []
    for names in VALID:
        alone = [set(METHODS[name].config_class.supported_loss_types) for name in names]
        both = set.intersection(*alone)
        config = EntropyGRPOConfig(output_dir=str(tmp_path), use_cpu=True, entropy_control=list(names))
        declared = config.supported_loss_types
        assert sorted(declared) == sorted(both), names
        if both != set.union(*alone):
            narrowed.append(names)
    assert narrowed, "no pair whose methods take different loss types: a union would pass too"


# Entrocraft: its two variants on two axes, and its warning beside another method that drives the entropy.


def test_the_authors_switch_takes_the_baseline_axis_and_the_sign_form_its_own(tmp_path):
    with pytest.raises(ValueError, match="'qae' and 'entrocraft', which both act on the group baseline"):
        toy_config(EntropyGRPOConfig, tmp_path, entropy_control=["qae", "entrocraft"])
    config = toy_config(EntropyGRPOConfig, tmp_path, entropy_control=["entrocraft_sign", "qae"])
    assert config.entrocraft_variant == "sign" and [part.key for part in config.method_parts] == ["qae", "entrocraft"]
    with pytest.raises(
        ValueError, match="names 'entrocraft', which stands for entrocraft_variant='code'.*'entrocraft_sign'"
    ):
        toy_config(EntropyGRPOConfig, tmp_path, entropy_control=["entrocraft"], entrocraft_variant="sign")


def test_another_entropy_controller_beside_it_is_named_in_a_warning(tmp_path):
    for options, named in (
        ({"entropy_control": ["aent", "entrocraft"]}, "['aent']"),
        ({"entropy_control": ["entrocraft"], "use_adaptive_entropy": True}, "['use_adaptive_entropy']"),
    ):
        with pytest.warns(UserWarning, match=rf"Entrocraft holds the entropy in its band, and \{named}"):
            toy_config(EntropyGRPOConfig, tmp_path, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        toy_config(EntropyGRPOConfig, tmp_path, entropy_control=["clip_cov", "entrocraft"])
