"""Clip-Cov (arXiv:2505.22617, §4.2, eqs. 10–12; docs/clip_cov.md) against the independent float64 reference of
`_support/cov.py`: its selection, loss and gradients, training, its generator in checkpoints, its selection over the
generation batch."""

import itertools
import math
import os

import pytest
import torch
from _reference.combined_reference import clip_binds, covariance
from _reference.pairs import PairMethod, PairReference, widest_gap
from _support.cov import (
    LOSS_TYPES,
    Reference,
    assert_same,
    batch,
    clip_cov_loss_fn,
    clip_cov_reference,
    constructed_case,
    generation_batch,
    reference_candidates,
    reference_count,
    reference_pooled_covariance,
    run_training,
    selected_set,
    token_mask,
    train_options,
    window_around,
)
from _support.distributed_run import logged
from _support.grpo import loss_and_gradients, make_grpo_batch
from _support.parity import ACCUMULATION, TRL
from transformers import AutoModelForCausalLM

from trl_entropy.methods.clip_cov import (
    CLIP_COV_GENERATOR_FILE,
    ClipCovConfig,
    ClipCovTrainer,
    clip_cov_selection,
    generation_batch_seed,
)
from trl_entropy.toy import build_toy_dataset, toy_reward


def test_clip_cov_selection_takes_every_candidate_when_few():
    cov, mask, clip_active = constructed_case()
    candidates = reference_candidates(cov, mask, clip_active, 1.0, 5.0)
    assert candidates == {(0, 1), (0, 6), (0, 7), (1, 0), (1, 1), (1, 4)}
    # N_valid = 13 (the 3 padded tokens do not count): ratio 0.5 -> 6 tokens, ratio 0.9 -> 11: every candidate.
    for ratio in (0.5, 0.9):
        generator = torch.Generator().manual_seed(0)
        before = generator.get_state()
        selected = clip_cov_selection(cov, mask, clip_active, ratio, 1.0, 5.0, generator)
        assert selected.dtype == torch.bool and selected.shape == cov.shape
        assert selected_set(selected) == candidates
        assert torch.equal(generator.get_state(), before)  # no random choice was needed


def test_clip_cov_selection_counts_only_valid_tokens():
    cov, mask, clip_active = constructed_case()
    # N_valid = 13: ratio 0.25 -> floor(3.25) = 3 tokens (16 positions would give 4).
    for seed in range(20):
        selected = clip_cov_selection(cov, mask, clip_active, 0.25, 1.0, 5.0, torch.Generator().manual_seed(seed))
        chosen = selected_set(selected)
        assert len(chosen) == reference_count(0.25, 13) == 3
        assert chosen <= reference_candidates(cov, mask, clip_active, 1.0, 5.0)
        assert not (selected & ~mask.bool()).any()


def test_clip_cov_selection_is_uniform_and_seeded():
    cov, mask, clip_active = constructed_case()
    candidates = sorted(reference_candidates(cov, mask, clip_active, 1.0, 5.0))
    ratio = 2 / 13  # two of the six candidates
    draws = 3000
    generator = torch.Generator().manual_seed(0)
    counts = dict.fromkeys(candidates, 0)
    subsets = set()
    for _ in range(draws):
        chosen = selected_set(clip_cov_selection(cov, mask, clip_active, ratio, 1.0, 5.0, generator))
        assert len(chosen) == 2
        subsets.add(frozenset(chosen))
        for token in chosen:
            counts[token] += 1
    # Each candidate is chosen with probability 2/6: expected 1000, standard deviation ~26.
    for token, count in counts.items():
        assert abs(count - draws / 3) < 130, (token, count)
    assert len(subsets) == math.comb(6, 2)  # every pair occurs
    # Same seed, same choice; another seed, another sequence of choices.
    first = clip_cov_selection(cov, mask, clip_active, ratio, 1.0, 5.0, torch.Generator().manual_seed(7))
    again = clip_cov_selection(cov, mask, clip_active, ratio, 1.0, 5.0, torch.Generator().manual_seed(7))
    assert torch.equal(first, again)
    sequences = set()
    for seed in range(5):
        generator = torch.Generator().manual_seed(seed)
        sequences.add(
            tuple(
                frozenset(selected_set(clip_cov_selection(cov, mask, clip_active, ratio, 1.0, 5.0, generator)))
                for _ in range(4)
            )
        )
    assert len(sequences) > 1


def test_clip_cov_selection_empty_cases():
    cov, mask, clip_active = constructed_case()
    generator = torch.Generator().manual_seed(0)
    # No valid token at all.
    assert not clip_cov_selection(cov, torch.zeros_like(mask), clip_active, 0.5, 1.0, 5.0, generator).any()
    # Zero covariance (all-equal advantages) and lb = 1 > 0: no candidate.
    zero = torch.zeros_like(cov)
    assert not clip_cov_selection(zero, mask, torch.zeros_like(clip_active), 1.0, 1.0, 5.0, generator).any()
    # Every in-range token clipped already.
    in_range = (cov > 1) & (cov < 5)
    assert not clip_cov_selection(cov, mask, in_range, 1.0, 1.0, 5.0, generator).any()


# Clip-Cov: loss and gradients
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type, beta", [("grpo", 0.0), ("bnpo", 0.04), ("dr_grpo", 0.0), ("dapo", 0.04)])
def test_clip_cov_loss_and_gradients(toy_model_path, toy_tokenizer, toy_trainer_of, loss_type, beta):
    """Every candidate detached (n >= candidates): loss and gradients equal the float64 reference."""
    inputs = batch(toy_model_path, toy_tokenizer, seed=LOSS_TYPES.index(loss_type))
    reference = Reference(toy_model_path, inputs)
    eligible = [reference.cov[token] for token in reference.valid if not reference.clip_active(*token)]
    lb, ub = window_around(eligible, len(eligible) - 5, len(eligible) - 1)  # four candidates, the top one excluded
    detached = clip_cov_reference(reference, lb, ub)
    assert len(detached) == 4
    trainer = toy_trainer_of(
        "clip_cov",
        accumulation=ACCUMULATION,
        loss_type=loss_type,
        beta=beta,
        clip_cov_ratio=0.5,  # n = 8 of the 16 valid tokens >= 4 candidates
        clip_cov_lb=lb,
        clip_cov_ub=ub,
    )
    loss, gradients = loss_and_gradients(trainer, inputs)
    expected_loss, expected_gradients = reference.loss_and_gradients(
        clip_cov_loss_fn(detached), loss_type, 6, beta=beta
    )
    assert_same(loss, gradients, expected_loss, expected_gradients)
    # Detaching changed the loss (the case can fail), and the fraction counts valid tokens only.
    undetached_loss = reference.loss(clip_cov_loss_fn(set()), loss_type, 6, beta=beta)
    assert abs(undetached_loss - expected_loss) > 1e-4
    fraction = trainer._metrics["train"]["clip_cov/detached_fraction"]
    assert fraction == [pytest.approx(4 / len(reference.valid))]
    assert trainer._metrics["train"]["entropy/cov_logp_adv"][-1] == pytest.approx(
        sum(reference.cov.values()) / len(reference.valid), rel=1e-4, abs=1e-7
    )


def test_clip_cov_random_choice_is_seeded(toy_model_path, toy_tokenizer, toy_trainer_of):
    """n < candidates: the detached pair is one of the C(c, 2) candidate pairs, fixed by the seed."""
    inputs = batch(toy_model_path, toy_tokenizer, seed=11)
    reference = Reference(toy_model_path, inputs)
    eligible = [reference.cov[token] for token in reference.valid if not reference.clip_active(*token)]
    lb, ub = window_around(eligible, len(eligible) - 6, len(eligible))  # the six largest eligible covariances
    candidates = sorted(clip_cov_reference(reference, lb, ub))
    assert len(candidates) == 6
    num_valid = len(reference.valid)
    ratio = 2.5 / num_valid  # n = 2
    subsets = list(itertools.combinations(candidates, 2))
    subset_losses = [reference.loss(clip_cov_loss_fn(set(s)), "bnpo", 6) for s in subsets]
    assert min(abs(a - b) for a, b in itertools.combinations(subset_losses, 2)) > 1e-5  # each pair is identifiable

    def chosen_pair(seed, name, check_gradients=False):
        trainer = toy_trainer_of(
            "clip_cov",
            name,
            accumulation=ACCUMULATION,
            loss_type="bnpo",
            seed=seed,
            clip_cov_ratio=ratio,
            clip_cov_lb=lb,
            clip_cov_ub=ub,
        )
        loss, gradients = loss_and_gradients(trainer, inputs)
        matches = [k for k, value in enumerate(subset_losses) if abs(value - loss.double()) < 1e-6]
        assert len(matches) == 1, "the loss matches no pair of candidates"
        if check_gradients:
            expected_loss, expected_gradients = reference.loss_and_gradients(
                clip_cov_loss_fn(set(subsets[matches[0]])), "bnpo", 6
            )
            assert_same(loss, gradients, expected_loss, expected_gradients)
        assert trainer._metrics["train"]["clip_cov/detached_fraction"] == [pytest.approx(2 / num_valid)]
        return matches[0]

    first = chosen_pair(0, "a", check_gradients=True)
    assert chosen_pair(0, "b") == first
    assert any(chosen_pair(seed, f"s{seed}") != first for seed in range(1, 6))


def test_clip_cov_evaluation_does_not_shift_training_draws(toy_model_path, toy_tokenizer, toy_trainer_of):
    """Both generators start from args.seed (+ process index 0); evaluation draws from its own."""
    inputs = batch(toy_model_path, toy_tokenizer, seed=12)
    trainer = toy_trainer_of(
        "clip_cov", accumulation=ACCUMULATION, seed=3, clip_cov_ratio=0.1, clip_cov_lb=-1e9, clip_cov_ub=1e9
    )
    seeded = torch.Generator().manual_seed(3).get_state()
    generators = trainer.part("clip_cov").generators
    assert all(torch.equal(generators[mode].get_state(), seeded) for mode in ("train", "eval"))
    trainer.model.eval()
    with torch.no_grad():
        trainer.compute_loss(trainer.model, dict(inputs))
    assert torch.equal(generators["train"].get_state(), seeded)
    assert not torch.equal(generators["eval"].get_state(), seeded)
    assert trainer._metrics["eval"]["clip_cov/detached_fraction"] == [pytest.approx(1 / 16)]  # n = floor(1.6) = 1
    trainer.model.train()
    trainer.compute_loss(trainer.model, dict(inputs))
    assert not torch.equal(generators["train"].get_state(), seeded)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("case", ["no_candidate", "equal_advantages"])
def test_clip_cov_without_candidates_equals_grpo_trainer(
    toy_model_path, toy_tokenizer, loss_type, case, toy_trainer_of
):
    """No candidate (bounds above every covariance, or zero covariance with lb=1): exactly trl.GRPOTrainer."""
    inputs = batch(toy_model_path, toy_tokenizer, seed=20 + LOSS_TYPES.index(loss_type))
    options = {"loss_type": loss_type, "beta": 0.04, "clip_cov_ratio": 1.0}
    if case == "no_candidate":
        options.update(clip_cov_lb=1e3, clip_cov_ub=1e4)
    else:
        inputs["advantages"] = torch.full_like(inputs["advantages"], 0.7)  # defaults lb=1, ub=5
    ours = toy_trainer_of("clip_cov", "ours", accumulation=ACCUMULATION, **options)
    trl_options = {k: v for k, v in options.items() if not k.startswith("clip_cov")}
    trl = toy_trainer_of(TRL, "trl", accumulation=ACCUMULATION, **trl_options)
    loss, gradients = loss_and_gradients(ours, inputs)
    trl_loss, trl_gradients = loss_and_gradients(trl, inputs)
    assert_same(loss, gradients, trl_loss.double(), {k: v.double() for k, v in trl_gradients.items()})
    assert ours._metrics["train"]["clip_cov/detached_fraction"] == [0.0]


def test_clip_cov_detaches_any_token_of_a_surrogate_without_clip(toy_model_path, toy_tokenizer, toy_trainer_of):
    """With every token a candidate, Clip-Cov detaches all of them under CISPO, SAPO and VESPO (none is flat), but
    only the clip-inactive ones under LUSPO's PPO clip."""
    model = AutoModelForCausalLM.from_pretrained(toy_model_path)
    inputs = make_grpo_batch(model, len(toy_tokenizer), seed=3, old_noise=0.3)
    for loss_type in ("cispo", "sapo", "vespo", "luspo"):
        trainer = toy_trainer_of(
            "clip_cov", loss_type, loss_type=loss_type, clip_cov_ratio=1.0, clip_cov_lb=-1e9, clip_cov_ub=1e9
        )
        loss, grads = loss_and_gradients(trainer, inputs)
        fraction = trainer._metrics["train"]["clip_cov/detached_fraction"][-1]
        if loss_type == "luspo":
            assert 0 < fraction < 1
        else:
            assert fraction == 1.0 and loss.item() == 0.0
            assert all(g.abs().max() == 0 for g in grads.values())


def test_clip_cov_with_delta(toy_model_path, toy_tokenizer, toy_trainer_of):
    """TRL's delta: the surrogate caps the ratio, and delta-capped tokens are no candidates."""
    delta = 1.25
    inputs = batch(toy_model_path, toy_tokenizer, seed=1, old_noise=0.5)
    reference = Reference(toy_model_path, inputs)
    assert all(abs(reference.ratio_list[i][t] - delta) > 1e-5 for i, t in reference.valid)

    def flat(i, t):
        ratio, advantage = reference.ratio_list[i][t], reference.advantage_list[i]
        return reference.clip_active(i, t) or (advantage < 0 and ratio > delta)

    capped = [token for token in reference.valid if flat(*token) and not reference.clip_active(*token)]
    assert capped, "no delta-capped token: the case tests nothing"
    candidates = {token for token in reference.valid if not flat(*token)}
    lb, ub = window_around([reference.cov[t] for t in reference.valid], 0, len(reference.valid))  # all in range
    trainer = toy_trainer_of(
        "clip_cov",
        accumulation=ACCUMULATION,
        loss_type="bnpo",
        delta=delta,
        clip_cov_ratio=1.0,
        clip_cov_lb=lb,
        clip_cov_ub=ub,
    )
    loss, gradients = loss_and_gradients(trainer, inputs)

    def per_token_loss(log_probs, old, ratio, advantages):
        surrogate = -torch.min(torch.clamp(ratio, max=delta) * advantages, torch.clamp(ratio, 0.8, 1.2) * advantages)
        return surrogate * (1 - token_mask(ratio.shape, candidates))

    expected_loss, expected_gradients = reference.loss_and_gradients(per_token_loss, "bnpo", 6)
    torch.testing.assert_close(loss.double(), expected_loss, rtol=1e-5, atol=1e-8)
    for name, expected in expected_gradients.items():
        torch.testing.assert_close(gradients[name].double(), expected, rtol=2e-4, atol=1e-7, msg=name)
    assert trainer._metrics["train"]["clip_cov/detached_fraction"] == [
        pytest.approx(len(candidates) / len(reference.valid))
    ]


# ---------------------------------------------------------------------------------------------------------------------


def test_clip_cov_trains_end_to_end(warm_toy_policy_path, tmp_path):
    config = ClipCovConfig(**train_options(tmp_path, "clip", clip_cov_ratio=0.05, clip_cov_lb=0.0, num_iterations=2))
    trainer = run_training(ClipCovTrainer, config, warm_toy_policy_path)
    fractions = logged(trainer, "clip_cov/detached_fraction")
    assert len(fractions) == 3 and all(0 <= f <= 0.5 for f in fractions)
    assert any(f > 0 for f in fractions)
    assert len(logged(trainer, "entropy/cov_logp_adv")) == 3
    assert all(math.isfinite(loss) for loss in logged(trainer, "loss"))


def test_clip_cov_generator_state_in_checkpoints(warm_toy_policy_path, tmp_path):
    """Each checkpoint holds the generator's state; resuming continues the random stream instead of restarting it."""
    options = train_options(
        tmp_path, "full", clip_cov_ratio=0.05, clip_cov_lb=-1e9, clip_cov_ub=1e9, save_strategy="steps", save_steps=1
    )
    options["max_steps"] = 2
    full = run_training(ClipCovTrainer, ClipCovConfig(**options), warm_toy_policy_path)
    seed_state = torch.Generator().manual_seed(full.args.seed).get_state()
    saved = [
        torch.load(
            os.path.join(options["output_dir"], f"checkpoint-{step}", CLIP_COV_GENERATOR_FILE.format(process_index=0))
        )
        for step in (1, 2)
    ]
    assert not torch.equal(saved[0], seed_state) and not torch.equal(saved[0], saved[1])  # the stream advanced
    assert torch.equal(saved[1], full.part("clip_cov").generators["train"].get_state())

    resumed_options = dict(options, output_dir=str(tmp_path / "resumed"))
    resumed = ClipCovTrainer(
        model=warm_toy_policy_path,
        reward_funcs=toy_reward,
        args=ClipCovConfig(**resumed_options),
        train_dataset=build_toy_dataset(64, seed=0),
        processing_class=full.processing_class,
    )
    resumed.train(resume_from_checkpoint=os.path.join(options["output_dir"], "checkpoint-1"))
    # The resumed run's second step drew from checkpoint-1's state, so it ends where the uninterrupted run ended.
    assert torch.equal(resumed.part("clip_cov").generators["train"].get_state(), saved[1])


# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("on_policy", [True, False], ids=["on_policy", "off_policy"])
def test_clip_cov_generation_batch_selection_equals_float64_reference(
    toy_model_path, toy_tokenizer, on_policy, toy_trainer_of
):
    """Candidates lb < Cov_t < ub over the whole generation batch (every ratio is 1 at the rollout, so no clip is
    active); n of them drawn by ``randperm`` from a generator seeded with the training seed and the step."""
    inputs = generation_batch(toy_model_path, toy_tokenizer, seed=61, on_policy=on_policy)
    cov = reference_pooled_covariance(toy_model_path, inputs)
    lb, ub = window_around(list(cov.values()), len(cov) - 9, len(cov) - 1)  # eight candidates, the top one excluded
    candidates = sorted(token for token in cov if lb < cov[token] < ub)  # row-major: the pool's order
    assert len(candidates) == 8
    options = dict(clip_cov_lb=lb, clip_cov_ub=ub, cov_selection_scope="generation_batch", seed=5)
    trainer = toy_trainer_of("clip_cov", accumulation=ACCUMULATION, clip_cov_ratio=1.0, **options)
    selection = trainer.part("clip_cov").select_over_generation_batch(dict(inputs))
    assert selected_set(selection) == set(candidates)  # n >= candidates
    trainer = toy_trainer_of("clip_cov", accumulation=ACCUMULATION, clip_cov_ratio=3.5 / len(cov), **options)
    draws = []
    for step in (0, 1, 0):
        trainer.state.global_step = step
        generator = torch.Generator().manual_seed(generation_batch_seed(5, step))
        expected = {candidates[k] for k in torch.randperm(len(candidates), generator=generator)[:3].tolist()}
        draws.append(selected_set(trainer.part("clip_cov").select_over_generation_batch(dict(inputs))))
        assert draws[-1] == expected, step
    assert draws[0] != draws[1] and draws[0] == draws[2]  # a function of the step, not of a stream
    assert generation_batch_seed(5, 0) != generation_batch_seed(6, 0)


# The pair table's piece (tests/compose/test_pairs.py): its gate, which reads the PPO clip, and its lower bound.


def pair_clip_cov_gate(per_token_loss, log_probs, old_log_probs, entropy, old_entropy, advantages, mask, s):
    """Clip-Cov (arXiv:2505.22617, §4.2) zeroes the loss of the valid tokens whose clip does not bind and whose
    covariance lies in ``(lb, ub)`` (all of them: the pair runs' ratio selects every candidate)."""
    ratio = torch.exp(log_probs - old_log_probs).detach()
    cov = covariance(log_probs, advantages, mask)
    candidates = mask.bool() & ~clip_binds(ratio, advantages, s) & (cov > s["clip_cov_lb"]) & (cov < s["clip_cov_ub"])
    return torch.where(candidates, torch.zeros_like(per_token_loss), per_token_loss)


def pair_clip_cov_lower_bound(log_probs, advantages, mask):
    """The lower bound in the widest gap of the batch's covariances with the pair's token advantages."""
    lower_bound, _ = widest_gap(covariance(log_probs, advantages, mask)[mask.bool()])
    return dict(clip_cov_lb=lower_bound)


PAIR = PairReference(
    # Every candidate is detached: the choice among them is random.
    settings=dict(clip_cov_ratio=1.0, clip_cov_ub=100.0),
    methods={
        "clip_cov": PairMethod(
            "stop-gradient gates",
            acts_through_clip=True,
            gate=pair_clip_cov_gate,
            thresholds=pair_clip_cov_lower_bound,
        )
    },
)
