"""What Clip-Cov and KL-Cov share (`trl_entropy/methods/cov_selection.py`, arXiv:2505.22617, §4.2): where the PPO
clip is flat, the selection count, the pooled covariance, both configs, and the selection scopes (rank or the whole
generation batch: carried selection, accumulation, two processes, resume, evaluation)."""

import dataclasses
import itertools
import math

import pytest
import torch
from _support import cov_scope_run
from _support.cov import (
    LOSS_TYPES,
    Reference,
    assert_same,
    batch,
    clip_cov_loss_fn,
    clip_cov_reference,
    kl_cov_loss_fn,
    reference_clip_active,
    reference_count,
    reference_covariance,
    token_mask,
)
from _support.cov_scope_run import FRACTION, METHOD_OPTIONS, METHODS, load_records, train_recording, update_difference
from _support.distributed_run import logged, make_trainer, ranked_reward
from _support.grpo import loss_and_gradients, toy_config
from _support.parity import ACCUMULATION
from _support.rounding import Bound, check, record

from trl_entropy.core.statistics import covariance_moments, pooled_covariance
from trl_entropy.core.trl.surrogates import ppo_clip_active
from trl_entropy.methods.clip_cov import (
    CLIP_COV_GENERATOR_FILE,
    ClipCovConfig,
)
from trl_entropy.methods.cov_selection import COV_SELECTION_KEY, COV_SELECTION_SCOPES, selection_count
from trl_entropy.methods.kl_cov import KLCovConfig
from trl_entropy.toy import build_toy_dataset


# ---------------------------------------------------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("delta", [None, 1.5, 1.1])
def test_ppo_clip_active_is_where_the_surrogate_is_flat(delta):
    """Active exactly where the base surrogate (with TRL's delta) has zero derivative in r; verl's rule without it."""
    generator = torch.Generator().manual_seed(0)
    ratio = torch.empty(4000, dtype=torch.float64).uniform_(0.3, 2.0, generator=generator).requires_grad_()
    advantages = torch.randn(4000, dtype=torch.float64, generator=generator)
    advantages[:50] = 0.0
    capped = ratio if delta is None else torch.clamp(ratio, max=delta)
    loss = -torch.min(capped * advantages, torch.clamp(ratio, 0.8, 1.28) * advantages)
    (slope,) = torch.autograd.grad(loss.sum(), ratio)
    active = ppo_clip_active(ratio.detach(), advantages, 0.2, 0.28, delta)
    nonzero_advantage = advantages != 0
    assert torch.equal(active[nonzero_advantage], (slope == 0)[nonzero_advantage])
    assert not active[~nonzero_advantage].any()  # A = 0: nothing is clipped (verl: the two terms tie)
    assert 0 < active.float().mean() < 1
    if delta is None:
        expected = [reference_clip_active(r, a, 0.2, 0.28) for r, a in zip(ratio.tolist(), advantages.tolist())]
        assert active.tolist() == expected


def test_selection_count():
    for ratio, num_valid in [(2e-4, 0), (2e-4, 1), (2e-4, 4999), (2e-4, 5000), (2e-4, 12345), (0.25, 8), (1.0, 7)]:
        assert selection_count(ratio, num_valid) == reference_count(ratio, num_valid)
    assert selection_count(2e-4, 12345) == 2 and selection_count(2e-4, 0) == 0


def test_pooled_covariance_centres_over_the_whole_pool():
    """Two halves of a batch, each centred with the moments summed over both, give the whole batch's covariance."""
    generator = torch.Generator().manual_seed(3)
    log_probs = -torch.rand(6, 5, generator=generator) * 3
    advantages = torch.randn(6, generator=generator)
    mask = torch.ones(6, 5)
    mask[1, 2:] = 0
    mask[4, 1:] = 0
    expected = reference_covariance(log_probs.tolist(), advantages.tolist(), mask.tolist())
    halves = [slice(0, 2), slice(2, 6)]  # unequal, like two ranks with different numbers of tokens
    moments = sum(covariance_moments(log_probs[rows], advantages[rows], mask[rows]) for rows in halves)
    pooled = torch.cat([pooled_covariance(log_probs[rows], advantages[rows], mask[rows], moments) for rows in halves])
    assert pooled.dtype == torch.float64
    for (i, t), value in expected.items():
        assert pooled[i, t].item() == pytest.approx(value, rel=1e-12, abs=1e-12)
    assert not pooled[~mask.bool()].any()
    # Centred on a half alone, the terms differ: the pool's means matter.
    alone = pooled_covariance(
        log_probs[:2], advantages[:2], mask[:2], covariance_moments(*(x[:2] for x in (log_probs, advantages, mask)))
    )
    assert not torch.allclose(alone, pooled[:2])


# ---------------------------------------------------------------------------------------------------------------------


def test_config_defaults(tmp_path):
    clip = toy_config(ClipCovConfig, tmp_path)
    assert (clip.clip_cov_ratio, clip.clip_cov_lb, clip.clip_cov_ub, clip.epsilon) == (2e-4, 1.0, 5.0, 0.2)
    kl = toy_config(KLCovConfig, tmp_path, num_iterations=2)
    assert (kl.kl_cov_ratio, kl.kl_cov_coef) == (2e-3, 1.0)
    assert clip.cov_selection_scope == kl.cov_selection_scope == "micro_batch"  # the authors' code
    for config_class in (ClipCovConfig, KLCovConfig):
        for config_field in dataclasses.fields(config_class):
            assert config_field.metadata.get("help"), config_field.name


@pytest.mark.parametrize(
    "config_class, options, message",
    [
        (ClipCovConfig, {"clip_cov_ratio": 0.0}, "clip_cov_ratio"),
        (ClipCovConfig, {"clip_cov_ratio": -0.1}, "clip_cov_ratio"),
        (ClipCovConfig, {"clip_cov_ratio": 1.5}, "clip_cov_ratio"),
        (ClipCovConfig, {"clip_cov_ratio": float("nan")}, "clip_cov_ratio"),
        (ClipCovConfig, {"clip_cov_lb": 5.0}, "clip_cov_lb"),
        (ClipCovConfig, {"clip_cov_lb": 2.0, "clip_cov_ub": 1.0}, "clip_cov_ub=1.0"),
        (ClipCovConfig, {"clip_cov_lb": float("nan")}, "clip_cov_lb=nan"),
        (ClipCovConfig, {"importance_sampling_level": "sequence"}, "importance_sampling_level='sequence'"),
        (ClipCovConfig, {"cov_selection_scope": "global"}, "cov_selection_scope='global'"),
        (KLCovConfig, {"cov_selection_scope": "rank"}, "cov_selection_scope='rank'"),
        (KLCovConfig, {"kl_cov_ratio": 0.0}, "kl_cov_ratio"),
        (KLCovConfig, {"kl_cov_ratio": 2.0}, "kl_cov_ratio"),
        (KLCovConfig, {"kl_cov_coef": -1.0}, "kl_cov_coef=-1.0"),
        (KLCovConfig, {"kl_cov_coef": float("inf")}, "kl_cov_coef=inf"),
        (KLCovConfig, {"kl_cov_coef": float("nan")}, "kl_cov_coef=nan"),
        (KLCovConfig, {"importance_sampling_level": "sequence"}, "importance_sampling_level='sequence'"),
        (KLCovConfig, {"delta": 1.5}, "delta=1.5"),
    ],
)
def test_config_rejects_bad_values(tmp_path, config_class, options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        toy_config(config_class, tmp_path, num_iterations=2, **options)


def test_config_accepts_supported_options(tmp_path):
    for loss_type, scope in zip(LOSS_TYPES, itertools.cycle(["micro_batch", "generation_batch"])):
        toy_config(
            ClipCovConfig, tmp_path, loss_type=loss_type, delta=1.5, epsilon_high=0.28, cov_selection_scope=scope
        )
        toy_config(
            KLCovConfig, tmp_path, loss_type=loss_type, num_iterations=2, kl_cov_coef=0.0, cov_selection_scope=scope
        )
    toy_config(ClipCovConfig, tmp_path, clip_cov_ratio=1.0, clip_cov_lb=-1.0, clip_cov_ub=float("inf"))
    unbounded = toy_config(ClipCovConfig, tmp_path, clip_cov_lb=-math.inf, clip_cov_ub=math.inf)
    assert (unbounded.clip_cov_lb, unbounded.clip_cov_ub) == (-math.inf, math.inf)


@pytest.mark.parametrize("method", METHODS)
def test_generation_scope_loss_uses_the_carried_selection(toy_model_path, toy_tokenizer, method, toy_trainer_of):
    """The loss step applies the mask carried with the batch, on an off-policy micro-batch: KL-Cov penalises exactly
    the carried tokens; Clip-Cov detaches the carried tokens whose clip is not active at this step (a clip-active
    token already has no policy gradient, and its clipped loss stays)."""
    inputs = batch(toy_model_path, toy_tokenizer, seed=62, old_noise=0.5)
    reference = Reference(toy_model_path, inputs)
    carried = set(reference.valid[::2])
    common = dict(loss_type="bnpo", num_iterations=2, cov_selection_scope="generation_batch")
    if method == "clip_cov":
        clip_cov_reference(reference, -1e9, 1e9)  # no ratio within rounding of the clip boundaries
        trainer = toy_trainer_of("clip_cov", accumulation=ACCUMULATION, **common)
        affected = {token for token in carried if not reference.clip_active(*token)}
        assert set() != affected != carried, "the case must hold clip-active and free carried tokens"
        loss_fn, metric = clip_cov_loss_fn(affected), "clip_cov/detached_fraction"
    else:
        trainer = toy_trainer_of("kl_cov", accumulation=ACCUMULATION, **common)
        affected = carried
        loss_fn, metric = kl_cov_loss_fn(carried, 1.0), "kl_cov/penalised_fraction"
    with pytest.raises(KeyError, match="select_over_generation_batch"):
        trainer.compute_loss(trainer.model, dict(inputs))  # a hand-built batch without the mask
    inputs[COV_SELECTION_KEY] = token_mask(inputs["completion_mask"].shape, carried).bool()
    trainer._metrics["train"].clear()
    loss, gradients = loss_and_gradients(trainer, inputs)
    expected_loss, expected_gradients = reference.loss_and_gradients(loss_fn, "bnpo", 6)
    assert_same(loss, gradients, expected_loss, expected_gradients)
    assert trainer._metrics["train"][metric] == [pytest.approx(len(affected) / len(reference.valid))]


# How far apart two layouts' weights end, relative to the update (``update_difference``), measured on
# ATEN_CPU_CAPABILITY=default, avx2 and avx512 (tests/_support/rounding.py): rounding alone (the generation-batch
# scope, one micro-batch against two halves or one process against two) 2.3e-6, margin 43; a selection that depends on
# the layout (the micro-batch scope, which a scope bug would give) 1.6e-3 (KL-Cov) to 0.64 (Clip-Cov).
SAME_WEIGHTS, DIFFERENT_WEIGHTS = Bound(rel=0, abs=1e-4), 1e-3


@pytest.mark.parametrize("method", METHODS)
def test_selection_and_weights_do_not_depend_on_accumulation(warm_toy_policy_path, tmp_path, method):
    """(micro-batch 8 × accumulation 1) against (4 × 2), same generation batches: the generation-batch scope selects
    the same tokens and trains the same weights; the micro-batch scope trains other weights."""
    records = {}
    for scope in ("micro_batch", "generation_batch"):
        for per_device, accumulation in ((8, 1), (4, 2)):
            records[scope, per_device] = train_recording(
                method,
                warm_toy_policy_path,
                str(tmp_path / f"{scope}_{per_device}"),
                scope,
                per_device_train_batch_size=per_device,
                gradient_accumulation_steps=accumulation,
            )
    whole, split = records["generation_batch", 8], records["generation_batch", 4]
    iterations = 2 if method == "kl_cov" else 1  # KL-Cov trains twice on each generation batch
    assert len(whole["selection"]) == 4 // iterations  # one selection per generation batch
    assert split["selection"] == whole["selection"]
    # One micro-batch per step, on-policy (Clip-Cov) or penalised in both passes (KL-Cov): the logged fraction is the
    # generation batch's selected fraction. (With two micro-batches it is the mean of their fractions.)
    selected_fractions = [
        sum(len(chosen) for _, chosen in rows) / sum(len(ids) for ids, _ in rows) for rows in whole["selection"]
    ]
    assert all(fraction > 0 for fraction in selected_fractions)
    assert whole["fraction"] == pytest.approx([f for f in selected_fractions for _ in range(iterations)], rel=1e-6)
    check(f"cov layout weights apart[{method}]", update_difference(whole, split), 0.0, SAME_WEIGHTS)
    micro = update_difference(records["micro_batch", 8], records["micro_batch", 4])
    record(f"cov layout weights apart, micro-batch scope[{method}]", micro, 0.0, SAME_WEIGHTS)
    assert micro > DIFFERENT_WEIGHTS


@pytest.fixture(scope="module")
def two_process_records(two_ranks, warm_toy_policy_path, tmp_path_factory):
    """``{(method, scope): (one_process_record, [rank0_record, rank1_record])}``: cov_scope_run.py run on two CPU
    processes (gloo) with 4 completions each, and here on one process with 8, while the two ranks run."""
    two = tmp_path_factory.mktemp("cov_two_processes")
    options = ["--model", warm_toy_policy_path, "--out", str(two), "--per-device-batch-size", "4"]
    job = two_ranks.submit(cov_scope_run.main, options)
    try:  # the one-process runs go on here while the two ranks run
        one = {
            (method, scope): train_recording(
                method, warm_toy_policy_path, str(two / f"one_{method}_{scope}"), scope, per_device_train_batch_size=8
            )
            for method in METHODS
            for scope in COV_SELECTION_SCOPES
        }
    finally:
        job.wait()
    return {
        (method, scope): (record, load_records(str(two), method, scope)) for (method, scope), record in one.items()
    }


# Two processes (a launch-tier test); test_selection_and_weights_do_not_depend_on_accumulation is the fast check.
@pytest.mark.parametrize("method", METHODS)
def test_two_processes_select_and_train_like_one(two_process_records, method):
    """Two processes × 4 completions against one process × 8, the same completions: the generation-batch scope
    selects the same tokens (the ranks' parts in rank order) and trains the same weights; the micro-batch scope
    does not."""
    for scope in COV_SELECTION_SCOPES:
        one, two = two_process_records[method, scope]
        assert (one["num_processes"], two["num_processes"]) == (1, 2)
        assert two["replicas_equal"]  # DDP keeps the replicas identical
    one, two = two_process_records[method, "generation_batch"]
    assert one["selection"] and all(any(chosen for _, chosen in rows) for rows in one["selection"])
    assert two["selection"] == one["selection"]
    check(f"cov two-process weights apart[{method}]", update_difference(one, two), 0.0, SAME_WEIGHTS)
    one, two = two_process_records[method, "micro_batch"]
    micro = update_difference(one, two)
    record(f"cov two-process weights apart, micro-batch scope[{method}]", micro, 0.0, SAME_WEIGHTS)
    assert micro > DIFFERENT_WEIGHTS


@pytest.mark.parametrize("method, checkpoint", [("clip_cov", 2), ("kl_cov", 2), ("kl_cov", 3)])
def test_generation_scope_resume_reproduces_the_straight_run(warm_toy_policy_path, tmp_path, method, checkpoint):
    """4 steps straight against a checkpoint and the rest resumed (sampled completions). Clip-Cov's draw is seeded by
    the step, so nothing but the step has to come back; KL-Cov's checkpoint 3 lies inside a generation cycle (two
    iterations per generation batch), where the buffered batch, its selection included, comes back with it."""

    def train(name, resume=None):
        trainer = make_trainer(
            method,
            warm_toy_policy_path,
            str(tmp_path / name),
            rollout=None,
            reward=ranked_reward,  # advantages at every step, whatever is sampled
            cov_selection_scope="generation_batch",
            max_steps=4,
            save_strategy="steps",
            save_steps=1,
        )
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    straight = train("straight")
    folder = tmp_path / "straight" / f"checkpoint-{checkpoint}"
    assert not (folder / CLIP_COV_GENERATOR_FILE.format(process_index=0)).exists()  # no random state to restore
    resumed = train("resumed", resume=str(folder))
    later = range(checkpoint + 1, 5)
    for key in ("loss", FRACTION[method]):
        values = {entry["step"]: entry[key] for entry in straight.state.log_history if key in entry}
        again = {entry["step"]: entry[key] for entry in resumed.state.log_history if key in entry}
        assert sorted(values) == [1, 2, 3, 4]
        assert [again[step] for step in later] == pytest.approx([values[step] for step in later], rel=1e-5)
    assert len(set(logged(straight, "loss"))) == 4, "identical losses: the comparison would be weak"
    assert all(value > 0 for value in logged(straight, FRACTION[method]))  # tokens were selected at every step
    for (name, weight), resumed_weight in zip(
        straight.model.named_parameters(), resumed.model.parameters(), strict=True
    ):
        torch.testing.assert_close(resumed_weight, weight, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("method", METHODS)
def test_generation_scope_evaluation_selects_over_the_evaluation_batch(warm_toy_policy_path, tmp_path, method):
    """``evaluate()``: each evaluation batch is a generation batch; its selection reaches the evaluation loss, whose
    logged fraction is that batch's selected fraction (on-policy, no clip is active)."""
    trainer = make_trainer(
        method,
        warm_toy_policy_path,
        str(tmp_path / "run"),
        cov_selection_scope="generation_batch",
        per_device_eval_batch_size=8,
        trainer_kwargs={"eval_dataset": build_toy_dataset(2, seed=1)},  # 2 prompts × 4 completions
        **METHOD_OPTIONS[method],
    )
    selections = []
    generate = trainer._generate_and_score_completions

    def generate_and_record(inputs):
        output = generate(inputs)
        selections.append((output[COV_SELECTION_KEY], output["completion_mask"]))
        return output

    trainer._generate_and_score_completions = generate_and_record
    metrics = trainer.evaluate()
    ((selected, mask),) = selections  # one evaluation batch of 8
    assert 0 < selected.sum() < mask.sum()
    assert metrics[f"eval_{FRACTION[method]}"] == pytest.approx((selected.sum() / mask.sum()).item(), rel=1e-6)
