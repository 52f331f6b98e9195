"""Every pair of methods: its loss and every gradient against a float64 loss step written from the papers' formulas
(``_reference/combined_reference.py``), applied in the axis order; every refused pair's message; the loss types each
pair accepts and the refusal naming the method that refuses the rest.

Each method's part of this table, its piece, is declared in its own test file (``PAIR``, ``_reference/pairs.py``):
its settings here, its axis and its standing to the PPO clip as the docs name them (the refusals are written out from
them, not read from the code), its float64 formulas and the thresholds it chooses from the batch.

The batch is built so that every component acts with margins far above rounding: the old log-probs are the model's own
minus ``log RATIOS`` (tokens on both sides of the clip, with either sign of advantage), the rollout entropies the
model's own divided by ``ENTROPY_RATIOS`` (tokens inside and outside ERC's band), and the thresholds that select tokens
(each piece's ``thresholds``: Clip-Cov's lower bound, KL-Cov's share, EntroPIC's probability) are set in the middle of
the widest gap between the batch's own values.
"""

import itertools
import math
import warnings

import pytest
import torch
from _reference import combined_reference as reference
from _reference import float64_policy
from _support.grpo import loss_and_gradients, make_grpo_batch, toy_config

from trl_entropy import EntropyGRPOConfig, EntropyGRPOTrainer
from trl_entropy.core.trl.objectives import LOSS_TYPES
from trl_entropy.methods import METHODS, combination
from trl_entropy.methods.compose import controls_entropy


NAMES = [name for name, entry in METHODS.items() if controls_entropy(entry)]
PAIRS = list(itertools.combinations(NAMES, 2))
REFERENCES = reference.references()
PIECES = reference.pieces()
TRL_SETTINGS = dict(loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0)
SETTINGS = {
    **TRL_SETTINGS,
    **{key: value for declared in REFERENCES.values() for key, value in declared.settings.items()},
}
# The axis on which every method acts, one after another (docs/composing.md); on any other, one method at a time.
EVERY_ONE_ACTS = "stop-gradient gates"
SAME_AXIS = {
    axis: tuple(name for name in NAMES if name in PIECES and PIECES[name].axis == axis)
    for axis in dict.fromkeys(piece.axis for piece in PIECES.values())
    if axis != EVERY_ONE_ACTS
}
NO_CLIP = {
    pair
    for pair in PAIRS
    if set(pair) <= set(PIECES)
    and any(PIECES[first].acts_through_clip and PIECES[second].replaces_clip for first, second in (pair, pair[::-1]))
}
REFUSED = {
    **{
        pair: f"both act on the {axis}"
        for axis, names in SAME_AXIS.items()
        for pair in itertools.combinations(names, 2)
    },
    **{pair: "replaces that clip by its own surrogate" for pair in NO_CLIP},
    **{pair: message for declared in REFERENCES.values() for pair, message in declared.refused.items()},
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


def declaring_file(name: str) -> str:
    """Where the registry name ``name`` declares its piece: its method module's test file."""
    module = METHODS[name].trainer_class.__module__
    if not module.startswith("trl_entropy.methods."):
        return "tests/_reference/combined_reference.py"  # the base trainer's own settings have no method module
    return f"tests/methods/test_{module.rsplit('.', 1)[1]}.py"


def through_generation(names) -> bool:
    """A method that acts once per generation batch, from the rewards: the trainer's generation tail applies it."""
    return bool(reference.stages(names, "group_baseline") or reference.stages(names, "rollout_rejection"))


@pytest.fixture(scope="module")
def float64_model(toy_model_path):
    return float64_policy.float64_model(toy_model_path)


@pytest.fixture(scope="module")
def batch(float64_model, toy_tokenizer):
    inputs = make_grpo_batch(float64_model, len(toy_tokenizer), seed=3)
    with torch.no_grad():
        log_probs, entropy, _ = reference.scores(float64_model, inputs)
    inputs["old_per_token_logps"] = (log_probs - RATIOS.double().log()).float()
    inputs["old_entropy"] = (entropy / ENTROPY_RATIOS.double()).float()
    return inputs


def thresholds(model, inputs, names) -> dict:
    """The settings each method of ``names`` chooses from the batch's own values (its piece's ``thresholds``), given
    the token log-probs and the pair's token advantages."""
    with torch.no_grad():
        log_probs, entropy, _ = reference.scores(model, inputs)
        advantages = reference.group_advantages(REWARDS, names, SETTINGS)
        advantages = reference.token_advantages(advantages, log_probs, entropy, names, SETTINGS)
    mask = inputs["completion_mask"].double()
    chosen = {}
    for choose in reference.stages(names, "thresholds"):
        chosen |= choose(log_probs, advantages, mask)
    return chosen


def options_of(names, chosen: dict) -> dict:
    """TRL's settings and those of the selected methods' pieces, with the thresholds they chose."""
    fields = {key for name in names for key in METHODS[name].config_class.__dataclass_fields__}
    selected = [declared for declared in REFERENCES.values() if set(declared.methods) & set(names)]
    settings = {**TRL_SETTINGS, **{key: value for declared in selected for key, value in declared.settings.items()}}
    return {key: value for key, value in {**settings, **chosen}.items() if key in fields}


def test_the_table_covers_every_pair_of_the_registry():
    missing = [f"{name!r}: add it to PAIR in {declaring_file(name)}" for name in NAMES if name not in PIECES]
    assert not missing, "registry names without a piece of the pair table:\n" + "\n".join(missing)
    assert set(PIECES) == set(NAMES), "pieces of names the registry does not hold"
    keys = [key for declared in REFERENCES.values() for key in declared.settings]
    assert len(keys) == len(set(keys)) == len(SETTINGS) - len(TRL_SETTINGS), "a setting declared twice"
    assert set(REFUSED) <= set(PAIRS) and len(VALID) + len(REFUSED) == len(PAIRS) == math.comb(len(NAMES), 2)


@pytest.mark.filterwarnings("ignore:.*on-policy")
@pytest.mark.parametrize("names", VALID, ids="+".join)
def test_one_loss_step_equals_the_float64_components_in_axis_order(names, float64_model, batch, toy_trainer_of):
    chosen = thresholds(float64_model, batch, names)
    options = options_of(names, chosen)
    config_class = combination(list(names)).config_class
    trainer = toy_trainer_of((EntropyGRPOTrainer, config_class), entropy_control=list(names), **options)
    assert type(trainer) is combination(list(names)).trainer_class
    inputs = dict(batch)
    inputs["advantages"] = reference.group_advantages(REWARDS, (), SETTINGS).squeeze(1).float()  # TRL's, made by TRL
    if through_generation(names):
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
