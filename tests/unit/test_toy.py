"""Tests for the offline toy task (trl_entropy/toy/): tokenizer, model, dataset, reward, warm start, cache."""

import copy
import re

import pytest
import torch
from _support.grpo import TOY_CACHE
from _support.watchdog import run_together

from trl_entropy.toy import (
    TOY_ALPHABET,
    TOY_EOS_TOKEN,
    TOY_MODEL_MAX_LENGTH,
    build_toy_dataset,
    build_toy_model,
    build_toy_policy,
    build_toy_tokenizer,
    cpu_path,
    torch_single_thread,
    toy_problems,
    toy_reward,
    toy_success_rate,
    warm_start,
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_toy_tokenizer()


@pytest.fixture(scope="module")
def policy():
    """The default warm-started policy (the one examples use), from the tests' cache of it (which
    ``test_cache_round_trip_gives_identical_logits`` checks against a fresh build)."""
    return build_toy_policy(seed=0, cache_dir=TOY_CACHE)


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["23+45=", "0", "1 - 2 = -1", "  7*8=56 ", TOY_ALPHABET, "q: what is 3+4?", ""])
def test_tokenizer_round_trip(tokenizer, text):
    ids = tokenizer.encode(text)
    assert len(ids) == len(text)  # one token per character, no special tokens added
    assert tokenizer.decode(ids) == text
    assert tokenizer.batch_decode([ids])[0] == text


def test_tokenizer_special_tokens(tokenizer):
    assert (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token) == (
        "<pad>",
        "<bos>",
        "<eos>",
        "<unk>",
    )
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (
        0,
        1,
        2,
        3,
    )
    assert len(set(tokenizer.all_special_ids)) == 4
    assert len(tokenizer) == 4 + len(TOY_ALPHABET)
    assert tokenizer.padding_side == "left"
    assert tokenizer.model_max_length == TOY_MODEL_MAX_LENGTH
    assert tokenizer.chat_template is None
    # The eos marker written as text is the eos token; decoding can keep or skip it.
    ids = tokenizer.encode("12" + TOY_EOS_TOKEN)
    assert ids[-1] == tokenizer.eos_token_id and len(ids) == 3
    assert tokenizer.decode(ids + [tokenizer.pad_token_id]) == "12<eos><pad>"
    assert tokenizer.decode(ids + [tokenizer.pad_token_id], skip_special_tokens=True) == "12"
    # Characters outside the alphabet become <unk> instead of failing.
    assert tokenizer.encode("1%2") == [tokenizer.encode("1")[0], tokenizer.unk_token_id, tokenizer.encode("2")[0]]


def test_tokenizer_pads_on_the_left(tokenizer):
    batch = tokenizer(["1+2=", "11+12="], padding=True, return_tensors="pt")
    assert batch["input_ids"].shape == (2, 6)
    assert batch["input_ids"][0, :2].tolist() == [tokenizer.pad_token_id] * 2
    assert batch["attention_mask"].tolist() == [[0, 0, 1, 1, 1, 1], [1] * 6]
    assert tokenizer.decode(batch["input_ids"][0], skip_special_tokens=True) == "1+2="


# ---------------------------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------------------------


def test_model_forward_shapes_and_config(tokenizer):
    model = build_toy_model(tokenizer)
    batch = tokenizer(["1+2=", "11+12="], padding=True, return_tensors="pt")
    logits = model(**batch).logits
    assert logits.shape == (2, 6, len(tokenizer))
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    config = model.config
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (len(tokenizer), 64, 2)
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (0, 1, 2)
    assert (model.generation_config.pad_token_id, model.generation_config.eos_token_id) == (0, 2)
    assert config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert not model.training


def test_model_overrides(tokenizer):
    model = build_toy_model(tokenizer, tie_word_embeddings=False, num_hidden_layers=1)
    assert not model.config.tie_word_embeddings and model.config.num_hidden_layers == 1
    assert model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    assert model(input_ids=torch.tensor([[5, 6, 7]])).logits.shape == (1, 3, len(tokenizer))


def test_model_is_deterministic_by_seed(tokenizer):
    torch.manual_seed(123)
    rng_state = torch.get_rng_state()
    first, again, other = (build_toy_model(tokenizer, seed=s).state_dict() for s in (0, 0, 1))
    assert torch.equal(torch.get_rng_state(), rng_state)  # the global RNG is left alone
    assert first.keys() == again.keys() == other.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert any(not torch.equal(first[k], other[k]) for k in first)


def test_generate_stops_at_eos(policy):
    model, tokenizer = policy
    batch = tokenizer(["1+2=", "11+12=", "19+19="], padding=True, return_tensors="pt")
    with torch_single_thread():
        out = model.generate(**batch, max_new_tokens=6, do_sample=False)
    completions = out[:, batch["input_ids"].size(1) :]
    for row in completions.tolist():  # the warm-started policy ends its answer; generation stops and pads after it
        assert tokenizer.eos_token_id in row, row
        tail = row[row.index(tokenizer.eos_token_id) + 1 :]
        assert all(token == tokenizer.pad_token_id for token in tail), row
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    assert all(re.fullmatch(r"-?\d+", text) for text in texts), texts


# ---------------------------------------------------------------------------------------------------------------------
# Dataset and reward
# ---------------------------------------------------------------------------------------------------------------------


def _recompute(prompt):
    match = re.fullmatch(r"(\d+)([+\-*])(\d+)=", prompt)
    assert match, prompt
    a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def test_dataset_answers_are_correct():
    dataset = build_toy_dataset(200, seed=3)
    assert dataset.column_names == ["prompt", "answer"] and len(dataset) == 200
    for row in dataset:
        assert isinstance(row["prompt"], str) and isinstance(row["answer"], str)
        assert int(row["answer"]) == _recompute(row["prompt"])
    for prompt, answer in toy_problems("all"):
        assert int(answer) == _recompute(prompt)


def test_dataset_splits_and_seeding():
    train, test = {p for p, _ in toy_problems("train")}, {p for p, _ in toy_problems("test")}
    assert train and test and not train & test
    assert train | test == {p for p, _ in toy_problems("all")}
    assert set(build_toy_dataset(50, split="test")["prompt"]) <= test
    assert build_toy_dataset(30, seed=1)["prompt"] == build_toy_dataset(30, seed=1)["prompt"]
    assert build_toy_dataset(30, seed=1)["prompt"] != build_toy_dataset(30, seed=2)["prompt"]
    assert len(set(build_toy_dataset(len(test), split="test")["prompt"])) == len(test)  # no repeats when it fits
    assert len(build_toy_dataset(3 * len(train))) == 3 * len(train)  # with replacement beyond the split
    with pytest.raises(ValueError):
        build_toy_dataset(4, split="validation")


def test_operators_give_tasks_with_their_own_splits():
    addition = {split: toy_problems(split) for split in ("train", "test")}
    both = {split: toy_problems(split, operators=("+", "-")) for split in ("train", "test")}
    for split, problems in addition.items():  # an operator's split does not depend on which others come with it
        assert both[split][: len(problems)] == problems
        assert toy_problems(split, operators=("-", "+"))[-len(problems) :] == problems
    subtraction = toy_problems("all", operators=("-",))
    assert len(subtraction) == 400 and all("-" in prompt[1:] for prompt, _ in subtraction)
    assert any(answer.startswith("-") for _, answer in subtraction)  # negative answers exist
    for prompt, answer in subtraction:
        assert int(answer) == _recompute(prompt)
    train, test = ({p for p, _ in toy_problems(split, operators=("-",))} for split in ("train", "test"))
    assert len(train) == 320 and len(test) == 80 and not train & test
    dataset = build_toy_dataset(30, seed=2, split="test", operators=("-",))
    assert set(dataset["prompt"]) <= test
    for operators in ((), ("+", "+"), ("/",), ("plus",)):
        with pytest.raises(ValueError, match="operators must be distinct operators"):
            toy_problems("train", operators=operators)


def test_reward_hand_cases():
    completions = ["42", "43", " 42 \n", "42<eos>", "42<eos>7", "42 7", "4", "420", "", "<eos>42", "x42", "-42"]
    expected = [1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    rewards = toy_reward(completions, answer=["42"] * len(completions), prompt=["40+2="] * len(completions))
    assert rewards == expected
    assert all(isinstance(r, float) for r in rewards)
    assert toy_reward(["7"], answer=[" 7 "]) == [1.0]  # the answer is stripped too
    assert toy_reward([[{"role": "assistant", "content": "7"}]], answer=["7"]) == [1.0]  # conversational form
    with pytest.raises(ValueError):
        toy_reward(["1", "2"], answer=["1"])


# ---------------------------------------------------------------------------------------------------------------------
# Warm start, success rate, cache
# ---------------------------------------------------------------------------------------------------------------------


def test_warm_start_reduces_loss(tokenizer):
    model = build_toy_model(tokenizer, seed=5)
    losses = warm_start(model, tokenizer, steps=30, seed=5)
    assert len(losses) == 30 and losses[-1] < 0.7 * losses[0]
    assert not model.training  # mode restored


def test_warm_started_policy_succeeds_sometimes(policy):
    model, tokenizer = policy
    weights = {name: parameter.clone() for name, parameter in model.named_parameters()}
    rate = toy_success_rate(model, tokenizer, n=256, temperature=1.0, seed=0)
    assert 0.05 < rate < 0.95, rate
    assert not model.training and all(torch.equal(p, weights[name]) for name, p in model.named_parameters())
    assert toy_success_rate(model, tokenizer, n=256, temperature=1.0, seed=0) == rate  # reproducible
    # Far above an untrained model, which essentially never answers correctly.
    assert toy_success_rate(build_toy_model(tokenizer), tokenizer, n=64) < 0.05
    # Warm-started on addition only, it rarely solves the subtraction task (about 1% of its problems).
    assert toy_success_rate(model, tokenizer, n=256, operators=("-",)) < 0.05


def test_cache_round_trip_gives_identical_logits(tmp_path):
    fresh_model, fresh_tokenizer = build_toy_policy(seed=1, warm_start_steps=10)
    saved_model, _ = build_toy_policy(seed=1, warm_start_steps=10, cache_dir=tmp_path)  # miss: builds and saves
    folder = tmp_path / f"toy_policy_v1_seed1_steps10_{cpu_path()}"
    assert sorted(tmp_path.iterdir()) == [folder, tmp_path / (folder.name + ".lock")]  # the policy and its lock
    assert (folder / "config.json").exists() and (folder / "tokenizer.json").exists()
    mtime = (folder / "config.json").stat().st_mtime_ns
    loaded_model, loaded_tokenizer = build_toy_policy(seed=1, warm_start_steps=10, cache_dir=tmp_path)  # hit
    assert (folder / "config.json").stat().st_mtime_ns == mtime and len(list(tmp_path.iterdir())) == 2

    text = ["1+2=3", "19+19=38", "7+0=7"]
    batch = fresh_tokenizer(text, padding=True, return_tensors="pt")
    assert loaded_tokenizer(text, padding=True, return_tensors="pt")["input_ids"].equal(batch["input_ids"])
    assert loaded_tokenizer.padding_side == "left" and loaded_tokenizer.model_max_length == TOY_MODEL_MAX_LENGTH
    assert loaded_tokenizer.decode(loaded_tokenizer.encode("3 + 4 = 7")) == "3 + 4 = 7"
    with torch.no_grad():
        reference = fresh_model(**batch).logits
        assert torch.equal(saved_model(**batch).logits, reference)
        assert torch.equal(loaded_model(**batch).logits, reference)
    assert loaded_model.config.tie_word_embeddings
    assert loaded_model.generation_config.eos_token_id == fresh_tokenizer.eos_token_id


def test_policy_warm_started_on_two_tasks_is_cached_apart(tmp_path):
    build_toy_policy(seed=3, warm_start_steps=2, cache_dir=tmp_path)
    model, tokenizer = build_toy_policy(seed=3, warm_start_steps=2, cache_dir=tmp_path, operators=("+", "-"))
    path = cpu_path()
    assert path in {"default", "avx2", "avx512", "sve256", "zvector"}  # what ATEN_CPU_CAPABILITY accepts
    policies = [f"toy_policy_v1_seed3_steps2_{path}", f"toy_policy_v1_seed3_steps2_add_sub_{path}"]
    assert sorted(folder.name for folder in tmp_path.iterdir()) == sorted(policies + [p + ".lock" for p in policies])
    # The same weights as a direct warm start on both tasks' problems, which differs from the addition-only one.
    direct, _ = build_toy_policy(seed=3, warm_start_steps=2, operators=("+", "-"))
    addition_only, _ = build_toy_policy(seed=3, warm_start_steps=2)
    batch = tokenizer(["1-2=", "3+4="], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, direct(**batch).logits)
        assert not torch.equal(model(**batch).logits, addition_only(**batch).logits)


def test_concurrent_processes_warm_start_a_policy_once(tmp_path, monkeypatch):
    import importlib

    module = importlib.import_module("trl_entropy.toy.warm_start")
    real, log = module._warm_start_into, tmp_path / "warm_starts.log"

    def logged(*arguments):
        with open(log, "a") as handle:
            handle.write("warm start\n")
        real(*arguments)

    monkeypatch.setattr(module, "_warm_start_into", logged)  # the forked callers inherit it
    run_together(
        lambda: build_toy_policy(seed=1, warm_start_steps=10, cache_dir=tmp_path / "cache"),
        "two concurrent build_toy_policy callers",
    )
    assert log.read_text() == "warm start\n"  # the second caller waited for the first one's copy
    assert (tmp_path / "cache" / f"toy_policy_v1_seed1_steps10_{cpu_path()}" / "config.json").exists()


def test_cached_tokenizer_loads_with_auto_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    build_toy_policy(seed=2, warm_start_steps=0, cache_dir=tmp_path)
    folder = tmp_path / f"toy_policy_v1_seed2_steps0_{cpu_path()}"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.decode(tokenizer.encode("12 + 3 = 15")) == "12 + 3 = 15"
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.padding_side) == (0, 2, "left")


def test_torch_single_thread_restores_setting():
    before = torch.get_num_threads()
    with torch_single_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_grpo_trainer_runs_on_toy_task(policy, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = copy.deepcopy(policy[0]), policy[1]  # a copy: the shared fixture stays untouched
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        max_steps=3,
        report_to=[],
        use_cpu=True,
        logging_steps=1,
        bf16=False,
        save_strategy="no",
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=toy_reward,
        args=args,
        train_dataset=build_toy_dataset(64),
    )
    with torch_single_thread():
        trainer.train()
    logs = [entry for entry in trainer.state.log_history if "reward_std" in entry]
    assert len(logs) == 3
    assert max(entry["reward_std"] for entry in logs) > 0  # non-degenerate advantages
    assert all(0.0 <= entry["reward"] <= 1.0 for entry in logs)
