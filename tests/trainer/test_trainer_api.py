"""What every trainer offers as a drop-in `trl.GRPOTrainer`: a plain `GRPOConfig` as `args`, and `evaluate()`."""

import logging
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from _support.grpo import toy_config, toy_trainer
from _support.process import run_forked
from transformers import set_seed
from trl import GRPOConfig, GRPOTrainer

from trl_entropy import EntropyGRPOConfig
from trl_entropy.methods import METHODS, SPECS
from trl_entropy.toy import build_toy_dataset, toy_reward


ROOT = Path(__file__).resolve().parents[2]
# One entry per trainer class (REPO-R and REPO-D share one, EntReg is the base with a bonus).
TRAINERS = {m.trainer_class.__name__: m for m in METHODS.values()}
COMMON = dict(
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=6,
    report_to=[],
    use_cpu=True,
    bf16=False,
    seed=0,
)


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_a_plain_grpo_config_trains_every_trainer(name, warm_toy_policy_path, toy_tokenizer, tmp_path, caplog):
    method = TRAINERS[name]
    # Built first: creating training arguments resets accelerate's state, which a built trainer relies on.
    defaults = method.config_class(output_dir=str(tmp_path), **COMMON)
    grpo_args = GRPOConfig(output_dir=str(tmp_path), max_steps=1, learning_rate=5e-4, **COMMON)
    with caplog.at_level(logging.WARNING, logger="trl_entropy.core.config"):
        trainer = toy_trainer(
            method.trainer_class,
            grpo_args,
            warm_toy_policy_path,
            toy_tokenizer,
            train_dataset=build_toy_dataset(16, seed=0),
        )
    notices = [r for r in caplog.records if f"built a {method.config_class.__name__} from the GRPOConfig" in r.message]
    assert len(notices) == 1
    args = trainer.args
    assert type(args) is method.config_class
    # The fields the user changed keep their values ...
    for field, value in dict(max_steps=1, learning_rate=5e-4, **COMMON).items():
        assert getattr(args, field) == value, field
    # ... and the rest take the method's defaults, its own fields and the GRPOConfig fields it redefines alike.
    for field in fields(method.config_class):
        if field.init and field.name not in COMMON and field.name not in ("max_steps", "learning_rate"):
            assert getattr(args, field.name) == getattr(defaults, field.name), field.name
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def test_another_methods_config_is_refused(toy_model_path, toy_tokenizer, tmp_path):
    aent, repo = METHODS["aent"], METHODS["repo_r"]
    with pytest.raises(TypeError, match=r"needs `args` of type REPOConfig \(or a plain GRPOConfig\), got AEntConfig"):
        repo.trainer_class(
            model=toy_model_path,
            reward_funcs=toy_reward,
            args=aent.config_class(output_dir=str(tmp_path), **COMMON),
            processing_class=toy_tokenizer,
        )


def evaluate(trainer_class, config_class, path, tokenizer, output_dir, **options):
    set_seed(0)
    trainer = toy_trainer(
        trainer_class,
        toy_config(config_class, output_dir, per_device_eval_batch_size=8, **COMMON, **options),
        path,
        tokenizer,
        train_dataset=build_toy_dataset(16, seed=0),
        eval_dataset=build_toy_dataset(8, seed=1, split="test"),
    )
    controllers = {name: c.state_dict() for name, c in getattr(trainer, "controllers", {}).items()}
    metrics = trainer.evaluate()
    return trainer, controllers, metrics


def test_evaluate_equals_grpo_trainer(warm_toy_policy_path, toy_tokenizer, tmp_path):
    """With control off, evaluation (generation, rewards, loss) is TRL's, value for value."""
    _, _, ours = evaluate(
        METHODS["grpo"].trainer_class, EntropyGRPOConfig, warm_toy_policy_path, toy_tokenizer, tmp_path / "ours"
    )
    _, _, trl = evaluate(GRPOTrainer, GRPOConfig, warm_toy_policy_path, toy_tokenizer, tmp_path / "trl")
    for key in ("eval_loss", "eval_reward", "eval_entropy"):
        assert ours[key] == pytest.approx(trl[key], rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize("method", sorted(METHODS))
def test_evaluate_works_for_every_method_and_moves_no_controller(
    method, warm_toy_policy_path, toy_tokenizer, tmp_path
):
    spec = METHODS[method]
    trainer, controllers, metrics = evaluate(
        spec.trainer_class, spec.config_class, warm_toy_policy_path, toy_tokenizer, tmp_path, **spec.defaults
    )
    assert torch.isfinite(torch.tensor(metrics["eval_loss"]))
    assert 0 < metrics["eval_entropy"]
    assert {name: c.state_dict() for name, c in trainer.controllers.items()} == controllers


# Liger patches transformers' model modules for the whole process (its RMSNorm class, RoPE function...), and its Triton
# kernels do not run on the CPU: the check runs in a child process.
LIGER_METHODS = ("grpo", "aent")


def check_liger_keeps_the_entropy_head(model_path: str, output_dir: str) -> None:
    """Build each method of LIGER_METHODS with ``use_liger_kernel=True``, apply Liger as ``Trainer.train`` does first,
    and print ``<method>: entropy head kept`` where the model's forward is still the entropy head."""
    from transformers.integrations.liger import apply_liger_kernel

    for name in LIGER_METHODS:
        spec = METHODS[name]
        args = toy_config(
            spec.config_class,
            Path(output_dir) / name,
            use_liger_kernel=True,
            per_device_train_batch_size=8,
            num_generations=4,
        )
        trainer = toy_trainer(spec.trainer_class, args, model_path, train_dataset=build_toy_dataset(8))
        assert trainer.args.liger_kernel_config["fused_linear_cross_entropy"] is False
        head_forward = trainer.model.forward.__func__
        apply_liger_kernel(trainer.model, trainer.args.liger_kernel_config)
        norm = trainer.model.model.norm.forward.__func__
        assert norm.__qualname__ == "LigerRMSNorm.forward", "Liger was not applied"
        assert trainer.model.forward.__func__ is head_forward, "the entropy head was replaced"
        print(f"{name}: entropy head kept", flush=True)


@pytest.fixture(scope="module")
def liger_check(toy_model_path, tmp_path_factory):
    """What the check above printed, run once for every method of LIGER_METHODS."""
    _, printed = run_forked(check_liger_keeps_the_entropy_head, toy_model_path, str(tmp_path_factory.mktemp("liger")))
    return printed


@pytest.mark.parametrize("method", LIGER_METHODS)
def test_liger_layer_kernels_keep_the_entropy_head(method, liger_check):
    """`use_liger_kernel=True`: transformers applies Liger's layer kernels when training starts; the model's forward
    must stay the entropy head (TRL turns Liger's fused linear cross-entropy off for that). Liger's Triton kernels do
    not run on the CPU, even under the Triton interpreter, so this checks the wiring only."""
    assert f"{method}: entropy head kept" in liger_check.splitlines(), liger_check[-3000:]


# What each trainer's model card must say: the method, its paper (title and arXiv id) and its tag; the base is GRPO.
MODEL_CARDS = {
    spec.trainer_class.__name__: (spec.name, spec.paper.title, spec.paper.arxiv_id, spec.tag)
    for spec in SPECS
    if spec.paper is not None
} | {"EntropyGRPOTrainer": ("GRPO", "DeepSeekMath", "2402.03300", "trl-entropy")}


def references_row(trainer_name: str) -> str:
    """The row of docs/references.md that names ``trainer_name``: the paper the docs cite for it."""
    text = (ROOT / "docs" / "references.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and f"`{trainer_name}`" in line]
    assert len(rows) == 1, f"docs/references.md names {trainer_name} in {len(rows)} rows"
    return rows[0]


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_the_model_card_names_the_method_and_cites_its_paper_next_to_grpos(name, toy_model_path, tmp_path):
    method = TRAINERS[name]
    args = toy_config(method.config_class, tmp_path, **{**COMMON, **method.defaults})
    trainer = toy_trainer(method.trainer_class, args, toy_model_path, train_dataset=build_toy_dataset(8))
    trainer.create_model_card(model_name="toy")
    card = (tmp_path / "README.md").read_text()
    method_name, title, arxiv_id, tag = MODEL_CARDS[name]
    if name != "EntropyGRPOTrainer":  # the card cites the paper the docs cite for the method
        assert f'"{title}"' in references_row(name) and f"arXiv:{arxiv_id}" in references_row(name)
    assert f"trained with {method_name}" in card
    assert title in card and arxiv_id in card
    assert f"- {tag}\n" in card
    assert "@article{shao2024deepseekmath" in card  # GRPO's own citation stays
    if name != "EntropyGRPOTrainer":
        ours = card.split("@article{shao2024deepseekmath")[0]  # the method's entry comes first
        assert card.count("@misc{") == 1 and f"eprint        = {{{arxiv_id}}}" in ours
