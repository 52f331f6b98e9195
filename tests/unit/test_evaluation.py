"""trl_entropy.evaluation: pass@k (estimator, sampling callback), the entropy–reward law (fit, callback) and the
intervals over seeds and held-out problems (bootstrap)."""

import itertools
import math

import numpy as np
import pytest
import torch
from _support.grpo import toy_config, toy_trainer
from trl import GRPOConfig, GRPOTrainer

from trl_entropy import (
    AEntConfig,
    AEntTrainer,
    EntropyLaw,
    EntropyLawCallback,
    PassAtKCallback,
    evaluate_pass_at_k,
    fit_entropy_law,
    pass_at_k,
    pass_at_k_values,
)
from trl_entropy.evaluation import bootstrap_difference, bootstrap_mean, count_correct, resampled_means


# ---------------------------------------------------------------------------------------------------------------------
# pass@k
# ---------------------------------------------------------------------------------------------------------------------


def brute_force_pass_at_k(n, c, k):
    """The fraction of k-subsets of n samples (the first c correct) holding a correct one, by enumeration."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(index < c for index in subset) for subset in subsets) / len(subsets)


def product_pass_at_k(n, c, k):
    """Chen et al.'s numerically stable form, in float64: 1 − Π_{i=n−c+1..n} (1 − k/i)."""
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1))) if n - c >= k else 1.0


SMALL_CASES = [(n, c, k) for n in (1, 2, 5, 8) for c in range(n + 1) for k in range(1, n + 1)]


@pytest.mark.parametrize(("n", "c", "k"), SMALL_CASES)
def test_pass_at_k_equals_enumeration(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(
    ("n", "c", "k"), [(300, 1, 1), (300, 0, 150), (300, 300, 300), (300, 7, 200), (400, 3, 64), (512, 500, 512)]
)
def test_pass_at_k_large_n_is_exact(n, c, k):
    # C(400, 200) ≈ 1e119 and C(512, 256) ≈ 5e152: a float formula on the binomials themselves would overflow.
    value = pass_at_k(n, c, k)
    assert value == pytest.approx(product_pass_at_k(n, c, k), rel=1e-12, abs=1e-15)
    assert value == float(1 - __import__("fractions").Fraction(math.comb(n - c, k), math.comb(n, k)))
    assert (c == 0) == (value == 0.0) and ((n - c < k) == (value == 1.0))


def test_pass_at_k_on_arrays_and_tensors():
    n, c, k = 16, np.array([[0, 3, 16], [5, 8, 1]]), np.array([1, 4, 16])  # k broadcasts along the rows
    expected = np.array([[product_pass_at_k(16, ci, ki) for ci, ki in zip(row, k)] for row in c])
    result = pass_at_k(n, c, k)
    assert isinstance(result, np.ndarray) and result.dtype == np.float64 and result.shape == (2, 3)
    np.testing.assert_allclose(result, expected, rtol=1e-12)
    tensor = pass_at_k(torch.tensor(n), torch.tensor(c, dtype=torch.float32), torch.tensor(k))  # whole floats
    assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float64
    np.testing.assert_allclose(tensor.numpy(), expected, rtol=1e-12)
    assert pass_at_k([8, 8], [0, 8], 2).tolist() == [0.0, 1.0]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ((4, 1, 5), "k must be between 1 and num_samples"),
        ((4, 1, 0), "k must be between 1 and num_samples"),
        ((4, 5, 1), "num_correct must be between 0 and num_samples"),
        ((4, -1, 1), "num_correct must be between 0 and num_samples"),
        ((0, 0, 1), "num_samples must be at least 1"),
        ((4, 2.5, 1), "num_correct must be an integer"),
        ((True, 1, 1), "num_samples must be an integer"),
        ((4, 1, "2"), "k must be an integer"),
        ((4, np.array([1.5]), 1), "num_correct must be an integer"),
        ((4, np.array([True]), 1), "num_correct must hold integers"),
        ((4, np.array([1, 2]), np.array([1, 2, 3])), "must broadcast together"),
        ((4, torch.tensor([1, 5]), 2), "num_correct must be between 0 and num_samples"),
    ],
)
def test_pass_at_k_rejects_bad_input(arguments, message):
    with pytest.raises(ValueError, match=message):
        pass_at_k(*arguments)


def test_pass_at_k_values():
    assert pass_at_k_values(1) == [1]
    assert pass_at_k_values(16) == [1, 2, 4, 8, 16]
    assert pass_at_k_values(24) == [1, 2, 4, 8, 16, 24]
    with pytest.raises(ValueError, match="num_samples must be at least 1"):
        pass_at_k_values(0)


# ---------------------------------------------------------------------------------------------------------------------
# pass@k sampled through a trainer: a stand-in policy with a known success probability per prompt
# ---------------------------------------------------------------------------------------------------------------------

# The stand-in policy is the toy model with every weight zero: its logits are 0 at every position, so each sampled
# token is uniform over the vocabulary V (whatever the temperature). A completion of prompt i is correct when its
# first token is one of the prompt's `hits` token ids, which happens with probability p_i = hits_i / V, and pass@k
# = mean_i [1 − (1 − p_i)^k] in closed form.
HITS = (2, 6, 14, 30)  # of the toy vocabulary's 47 tokens
PROMPT_REPEATS = 10
NUM_SAMPLES = 32


def first_token_reward(completion_ids, hits, **kwargs):
    return [1.0 if ids and ids[0] < count else 0.0 for ids, count in zip(completion_ids, hits, strict=True)]


@pytest.fixture(scope="module")
def uniform_policy_path(tmp_path_factory, toy_tokenizer):
    from trl_entropy.toy import build_toy_model

    model = build_toy_model(toy_tokenizer)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    path = tmp_path_factory.mktemp("uniform_policy")
    model.save_pretrained(path)
    toy_tokenizer.save_pretrained(path)
    return str(path)


def stand_in_trainer(trainer_class, config_class, path, tokenizer, output_dir):
    from datasets import Dataset

    rows = [{"prompt": f"{count}+{repeat}=", "hits": count} for count in HITS for repeat in range(PROMPT_REPEATS)]
    args = toy_config(
        config_class,
        output_dir,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        num_generations=4,
        max_completion_length=1,  # the reward reads the first token only
        seed=0,
    )
    dataset = Dataset.from_list(rows)
    return toy_trainer(
        trainer_class, args, path, tokenizer, first_token_reward, train_dataset=dataset, eval_dataset=dataset
    )


def closed_form_and_tolerance(vocab_size, k):
    """mean_i [1 − (1 − p_i)^k] and 4 standard deviations of the estimator's mean over the prompts.

    The unbiased estimator is a U-statistic of order k over n samples with a kernel in {0, 1}, so its variance is at
    most (k / n) q (1 − q), q = 1 − (1 − p)^k (Hoeffding, 1948); the prompts are independent.
    """
    q = np.array([1.0 - (1.0 - hits / vocab_size) ** k for hits in HITS])
    variance = (k / NUM_SAMPLES) * (q * (1 - q)).sum() * PROMPT_REPEATS / (len(HITS) * PROMPT_REPEATS) ** 2
    return float(q.mean()), 4.0 * math.sqrt(variance)


@pytest.mark.parametrize(
    ("trainer_class", "config_class"), [(GRPOTrainer, GRPOConfig), (AEntTrainer, AEntConfig)], ids=["trl", "aent"]
)
def test_pass_at_k_callback_matches_the_closed_form(
    trainer_class, config_class, uniform_policy_path, toy_tokenizer, tmp_path
):
    trainer = stand_in_trainer(trainer_class, config_class, uniform_policy_path, toy_tokenizer, tmp_path)
    trainer.add_callback(PassAtKCallback(trainer, num_samples=NUM_SAMPLES))
    rng_state = torch.get_rng_state()
    trainer.evaluate()
    (logged,) = [entry for entry in trainer.state.log_history if "eval/pass@1" in entry]
    assert sorted(key for key in logged if key.startswith("eval/pass@")) == sorted(
        f"eval/pass@{k}" for k in (1, 2, 4, 8, 16, 32)
    )
    for k in (1, 2, 4, 8, 16, 32):
        expected, tolerance = closed_form_and_tolerance(len(toy_tokenizer), k)
        assert abs(logged[f"eval/pass@{k}"] - expected) <= tolerance, (k, logged[f"eval/pass@{k}"], expected)
    # The evaluation sampled from a forked generator: the training's random stream is where TRL's evaluation left it.
    torch.set_rng_state(rng_state)
    trainer.evaluate()
    second = [entry for entry in trainer.state.log_history if "eval/pass@1" in entry][-1]
    assert second["eval/pass@1"] == logged["eval/pass@1"]  # same step, same seed: the same samples


def test_evaluate_pass_at_k_threshold_and_seed(uniform_policy_path, toy_tokenizer, tmp_path):
    trainer = stand_in_trainer(GRPOTrainer, GRPOConfig, uniform_policy_path, toy_tokenizer, tmp_path)
    rng_state = torch.get_rng_state()
    first = evaluate_pass_at_k(trainer, trainer.eval_dataset, 8, seed=3)
    assert torch.equal(torch.get_rng_state(), rng_state)  # the global random state is left alone
    assert evaluate_pass_at_k(trainer, trainer.eval_dataset, 8, seed=3) == first
    assert list(first) == [1, 2, 4, 8] and 0 < first[1] < first[8] < 1
    # The per-problem counts are the same samples: pass@k of each, averaged, is the evaluation's value.
    correct = count_correct(trainer, trainer.eval_dataset, 8, seed=3)
    assert correct.shape == (len(trainer.eval_dataset),) and correct.min() >= 0 and correct.max() <= 8
    assert {k: float(np.mean([brute_force_pass_at_k(8, int(c), k) for c in correct])) for k in first} == (
        pytest.approx(first, abs=1e-12)
    )
    assert evaluate_pass_at_k(trainer, trainer.eval_dataset, 8, seed=3, reward_threshold=1.5) == dict.fromkeys(
        first, 0.0
    )
    with pytest.raises(ValueError, match="ks must lie between 1 and num_samples"):
        evaluate_pass_at_k(trainer, trainer.eval_dataset, 8, ks=[16])
    trainer.eval_dataset = None
    with pytest.raises(ValueError, match="dataset must be given"):
        PassAtKCallback(trainer)


# ---------------------------------------------------------------------------------------------------------------------
# Intervals: the two-level bootstrap over seeds and held-out problems
# ---------------------------------------------------------------------------------------------------------------------


def enumerated_bootstrap(table: np.ndarray) -> np.ndarray:
    """Every equally likely two-level resample's mean, by enumeration: a seed per draw, then a problem per draw
    within it."""
    num_seeds, num_problems = table.shape
    means = []
    for seeds in itertools.product(range(num_seeds), repeat=num_seeds):
        for problems in itertools.product(range(num_problems), repeat=num_seeds * num_problems):
            picks = [
                table[seed, problems[i * num_problems + j]]
                for i, seed in enumerate(seeds)
                for j in range(num_problems)
            ]
            means.append(sum(picks) / len(picks))
    return np.sort(np.asarray(means))


def test_bootstrap_equals_the_enumerated_distribution():
    table = np.array([[0.0, 1.0], [3.0, 7.0]])
    exact = enumerated_bootstrap(table)  # 2 × 2 seeds drawn, 2 × 2 × 2 problems: 64 atoms
    sampled = resampled_means(table, 200_000, seed=1)
    standard_error = exact.std() / math.sqrt(sampled.size)
    assert abs(sampled.mean() - exact.mean()) < 5 * standard_error
    assert sampled.var() == pytest.approx(exact.var(), rel=0.02)
    # The exact 2.5 % and 97.5 % quantiles are atoms whose cumulative probabilities straddle them with room to spare.
    values, counts = np.unique(exact, return_counts=True)
    cdf = np.cumsum(counts) / exact.size
    low, high = (values[np.searchsorted(cdf, q)] for q in (0.025, 0.975))
    interval = bootstrap_mean(table, num_resamples=200_000, seed=1)
    assert (interval.mean, interval.low, interval.high, interval.confidence) == (2.75, low, high, 0.95)
    assert bootstrap_mean(table, num_resamples=200_000, seed=1) == interval  # seeded: deterministic


def test_bootstrap_covers_a_known_mean():
    """Seeds with their own offset (sd 1) and problems with their own noise (sd 1): the 95 % interval covers the true
    mean about 95 % of the time with 30 seeds (resampling the problems only would cover it far less often)."""
    generator = np.random.default_rng(0)
    repeats, covered = 300, 0
    for repeat in range(repeats):
        table = 2.0 + generator.normal(size=(30, 1)) + generator.normal(size=(30, 10))
        interval = bootstrap_mean(table, num_resamples=1000, seed=repeat)
        covered += interval.low <= 2.0 <= interval.high
    assert 0.90 <= covered / repeats <= 0.985


def test_bootstrap_difference_is_paired():
    generator = np.random.default_rng(2)
    baseline = generator.normal(size=(5, 40)) * 10  # large spread common to both methods
    shifted = baseline + 0.1 + generator.normal(size=(5, 40)) * 0.01
    difference = bootstrap_difference(shifted, baseline, num_resamples=2000)
    assert difference.mean == pytest.approx(0.1, abs=0.005) and difference.excludes_zero()
    assert difference.high - difference.low < 0.01  # unpaired, the spread of 10 would swamp the shift of 0.1
    assert difference == bootstrap_mean(shifted - baseline, num_resamples=2000)
    # One value per seed: seeds resampled only. Drawing the lowest seed three times has probability 1/27 > 2.5 %.
    per_seed = bootstrap_mean([0.2, 0.4, 0.3])
    assert (per_seed.mean, per_seed.low, per_seed.high) == pytest.approx((0.3, 0.2, 0.4))
    assert bootstrap_mean([5.0]) == bootstrap_mean([[5.0]])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: bootstrap_mean([]), "values must be a non-empty vector"),
        (lambda: bootstrap_mean([[[1.0]]]), r"values must be a non-empty vector .* got shape \(1, 1, 1\)"),
        (lambda: bootstrap_mean([1.0, math.nan]), "values must hold finite numbers only; found 1"),
        (lambda: bootstrap_mean([1.0], confidence=1.0), "confidence must lie strictly between 0 and 1"),
        (lambda: resampled_means([1.0], 0), "num_resamples must be a positive integer"),
        (lambda: bootstrap_difference([1.0, 2.0], [1.0]), r"must have one shape .* got \(2, 1\) and \(1, 1\)"),
    ],
)
def test_bootstrap_rejects_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ---------------------------------------------------------------------------------------------------------------------
# The entropy–reward law
# ---------------------------------------------------------------------------------------------------------------------


def test_fit_entropy_law_recovers_a_and_b():
    rng = np.random.default_rng(0)
    entropy = rng.uniform(0.1, 1.2, size=200)
    exact = fit_entropy_law(entropy, -0.3 * np.exp(entropy) + 1.1)
    assert exact.a == pytest.approx(0.3, rel=1e-10) and exact.b == pytest.approx(1.1, rel=1e-10)
    assert exact.ceiling == pytest.approx(0.8, rel=1e-10) and exact.num_points == 200
    # With noise σ the slope's standard error is σ / sqrt(Σ (x − x̄)²) (ordinary least squares).
    sigma = 0.02
    noisy = fit_entropy_law(entropy, -0.3 * np.exp(entropy) + 1.1 + rng.normal(0, sigma, size=200))
    x = np.exp(entropy)
    slope_error = sigma / math.sqrt(((x - x.mean()) ** 2).sum())
    intercept_error = sigma * math.sqrt(1 / x.size + x.mean() ** 2 / ((x - x.mean()) ** 2).sum())
    assert abs(noisy.a - 0.3) < 4 * slope_error and abs(noisy.b - 1.1) < 4 * intercept_error
    reference_slope, reference_intercept = np.polyfit(x, -0.3 * x + 1.1 + 0 * x, 1)
    assert (-reference_slope, reference_intercept) == pytest.approx((exact.a, exact.b), rel=1e-9)
    assert exact.predict(0.0) == pytest.approx(exact.ceiling)


@pytest.mark.parametrize(
    ("entropy", "reward"),
    [
        (np.linspace(0.2, 1.0, 9), np.linspace(0.9, 0.1, 9)),  # 9 points: one short
        (np.full(30, 0.5), np.linspace(0.2, 0.8, 30)),  # one entropy: the slope is undetermined
        (0.5 + np.linspace(0, 0.005, 30), np.linspace(0.2, 0.8, 30)),  # spread of exp(H) ~0.3% < 1%
        (np.r_[np.linspace(0.2, 1.0, 9), [np.nan, 0.5]], np.r_[np.linspace(0.9, 0.1, 9), [0.5, np.inf]]),
        ([], []),
    ],
    ids=["too-few", "constant", "narrow", "non-finite", "empty"],
)
def test_fit_entropy_law_is_silent_on_degenerate_input(entropy, reward):
    assert fit_entropy_law(entropy, reward) is None


def test_fit_entropy_law_rejects_unpaired_input():
    with pytest.raises(ValueError, match="entropies and rewards must pair up"):
        fit_entropy_law([0.1, 0.2], [0.3])


@pytest.mark.parametrize(
    ("trainer_class", "config_class"), [(GRPOTrainer, GRPOConfig), (AEntTrainer, AEntConfig)], ids=["trl", "aent"]
)
def test_entropy_law_callback_logs_once_well_posed(
    trainer_class, config_class, toy_model_path, toy_tokenizer, tmp_path
):
    from trl_entropy.toy import build_toy_dataset

    args = config_class(
        output_dir=str(tmp_path), report_to=[], use_cpu=True, per_device_train_batch_size=4, num_generations=4
    )
    trainer = toy_trainer(trainer_class, args, toy_model_path, toy_tokenizer, train_dataset=build_toy_dataset(8))
    trainer.add_callback(EntropyLawCallback(trainer))
    entropy = np.linspace(1.0, 0.2, 14)
    reward = -0.25 * np.exp(entropy) + 0.95 + 0.01 * np.cos(np.arange(14))
    for step in range(14):
        trainer.state.global_step = step + 1
        trainer.log({"entropy": float(entropy[step]), "reward": float(reward[step])})
        trainer.log({"entropy": 0.1})  # a log without a reward (a step that did not generate) adds no point
    laws = [entry for entry in trainer.state.log_history if "entropy/law_a" in entry]
    assert [entry["step"] for entry in laws] == list(range(10, 15))  # nothing before the 10th point
    for entry in laws:
        x = np.exp(entropy[: entry["step"]])
        slope, intercept = np.polyfit(x, reward[: entry["step"]], 1)
        assert entry["entropy/law_a"] == pytest.approx(-slope, rel=1e-6)
        assert entry["entropy/law_b"] == pytest.approx(intercept, rel=1e-6)
        assert entry["entropy/predicted_ceiling"] == pytest.approx(intercept + slope, rel=1e-6)
    assert isinstance(fit_entropy_law(entropy, reward), EntropyLaw)


# ---------------------------------------------------------------------------------------------------------------------
# The demo reports them
# ---------------------------------------------------------------------------------------------------------------------


def test_demo_reports_pass_at_k_the_law_and_phase_2(tmp_path, monkeypatch):
    import json

    import transformers
    import trl
    from _support.grpo import TOY_CACHE

    from trl_entropy.demo import run as demo
    from trl_entropy.demo.arguments import DemoArguments

    titles = []
    plot = demo.plot
    monkeypatch.setattr(demo, "plot", lambda *args, **kwargs: titles.extend(plot(*args, **kwargs)))
    arguments = DemoArguments(
        output_dir=str(tmp_path),
        methods=["grpo", "repo_r"],
        max_steps=4,
        num_samples=4,
        workers=1,
        toy_policy_cache=TOY_CACHE,
    )
    summaries = demo.run_demo(arguments)

    history = json.loads((tmp_path / "history.json").read_text())
    versions = history["versions"]
    assert (versions["torch"], versions["transformers"], versions["trl"]) == (
        torch.__version__,
        transformers.__version__,
        trl.__version__,
    )
    assert list(history["phase2_histories"]) == ["grpo", "repo_r"]
    assert all(len(steps) == 4 for steps in history["phase2_histories"].values())
    for name, summary in summaries.items():
        assert sorted(summary["pass_at_k"]) == [1, 2, 4]
        assert 0 <= summary["pass_at_k"][1] <= summary["pass_at_k"][2] <= summary["pass_at_k"][4] <= 1
        assert summary["held_out_success"] == summary["pass_at_k"][1]
        rewards = [entry["reward"] for entry in history["phase2_histories"][name] if "reward" in entry]
        assert summary["phase2_gain"] == pytest.approx(rewards[-1] - rewards[0])
        assert math.isnan(summary["law_ceiling"])  # four logged points: the law is not fitted
    table = (tmp_path / "table.md").read_text()
    for header in ("held-out success (pass@1)", "pass@4", "ceiling b−a", "run→B", "phase-2 gain", "before"):
        assert header in table
    for header in ("Δ pass@4 vs grpo", "Δ phase-2 gain vs grpo", "Δ B pass@1 after vs grpo"):
        assert header in table
    # Each run once in the table with intervals and once in the table of every number, per phase.
    assert table.count("| repo_r |") == 2 and table.count("| repo_r→B |") == 2
    assert any("pass@k" in title for title in titles) and any("phase 2" in title for title in titles)
    assert (tmp_path / "entropy_collapse.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
