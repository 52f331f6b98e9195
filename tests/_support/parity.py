"""One trl.GRPOTrainer and one EntropyGRPOTrainer on the same toy model and settings, and the check that one loss step
of each gives the same loss and gradients."""

import torch
from trl import GRPOConfig, GRPOTrainer

from _support.grpo import loss_and_gradients, toy_dataset
from trl_entropy import EntropyGRPOConfig, EntropyGRPOTrainer
from trl_entropy.toy import toy_reward


ACCUMULATION = 2  # exercises the accumulation scaling of every loss type


def build_pair(path, tokenizer, tmp_path, dataset=None, reward_funcs=toy_reward, **options):
    """``(trl.GRPOTrainer, EntropyGRPOTrainer)`` on the model at ``path`` with ``tokenizer`` (a tokenizer or a
    vision-language processor), the same settings and ``dataset`` (the toy task's by default), in train mode."""
    common = dict(
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        report_to=[],
        use_cpu=True,
        bf16=False,  # fp32 end to end: the comparison is exact up to rounding
        gradient_accumulation_steps=ACCUMULATION,
        steps_per_generation=ACCUMULATION,
        **options,
    )
    dataset = toy_dataset(8) if dataset is None else dataset
    trainers = []
    for trainer_class, config_class, name in (
        (GRPOTrainer, GRPOConfig, "trl"),
        (EntropyGRPOTrainer, EntropyGRPOConfig, "ours"),
    ):
        args = config_class(output_dir=str(tmp_path / name), **common)
        trainer = trainer_class(
            model=path, reward_funcs=reward_funcs, args=args, train_dataset=dataset, processing_class=tokenizer
        )
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = ACCUMULATION
        trainers.append(trainer)
    return trainers


def assert_same_step(trl_trainer, our_trainer, inputs):
    trl_loss, trl_grads = loss_and_gradients(trl_trainer, inputs)
    our_loss, our_grads = loss_and_gradients(our_trainer, inputs)
    torch.testing.assert_close(our_loss, trl_loss, rtol=1e-5, atol=1e-7)
    assert set(our_grads) == set(trl_grads)
    assert any(g.abs().max() > 0 for g in trl_grads.values()), "the case produces no gradient: it tests nothing"
    for name, expected in trl_grads.items():
        # fp32 rounding scales with the tensor: a loss type that sums over tokens (luspo) has gradients of ~3, whose
        # near-zero entries then differ by up to ~1e-6 (9.5e-7 measured over 80 seeds of plain GRPO against TRL).
        atol = max(1e-7, 1e-6 * expected.abs().max().item())
        torch.testing.assert_close(our_grads[name], expected, rtol=1e-4, atol=atol, msg=name)
