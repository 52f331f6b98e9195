"""One trl.GRPOTrainer and one EntropyGRPOTrainer on the same toy model and settings, and the check that one loss step
of each gives the same loss and gradients."""

import torch
from trl import GRPOConfig, GRPOTrainer

from _support.grpo import build_trainer, loss_and_gradients
from trl_entropy.toy import toy_reward


# trl.GRPOTrainer and its config: the pair every parity test holds ours against.
TRL = (GRPOTrainer, GRPOConfig)
ACCUMULATION = 2  # exercises the accumulation scaling of every loss type


def build_pair(path, tokenizer, tmp_path, train_dataset=None, reward_funcs=toy_reward, **options):
    """``(trl.GRPOTrainer, EntropyGRPOTrainer)`` on the model at ``path`` with ``tokenizer`` (a tokenizer or a
    vision-language processor), the same settings, ``ACCUMULATION`` micro-batches per optimizer step and per generation
    and ``train_dataset`` (the toy task's by default), in train mode (:func:`build_trainer`)."""
    return [
        build_trainer(method, path, tokenizer, tmp_path / name, ACCUMULATION, train_dataset, reward_funcs, **options)
        for method, name in ((TRL, "trl"), ("grpo", "ours"))
    ]


def assert_same_step(trl_trainer, our_trainer, inputs, loss_atol=1e-7, gradient_share=1e-6):
    """One loss step of each trainer on ``inputs``: the same loss (``rtol`` 1e-5, ``loss_atol``) and every parameter's
    gradient (``rtol`` 1e-4, an absolute error of ``gradient_share`` of the tensor's largest entry)."""
    trl_loss, trl_grads = loss_and_gradients(trl_trainer, inputs)
    our_loss, our_grads = loss_and_gradients(our_trainer, inputs)
    torch.testing.assert_close(our_loss, trl_loss, rtol=1e-5, atol=loss_atol)
    assert set(our_grads) == set(trl_grads)
    assert any(g.abs().max() > 0 for g in trl_grads.values()), "the case produces no gradient: it tests nothing"
    for name, expected in trl_grads.items():
        # fp32 rounding scales with the tensor: a loss type that sums over tokens (luspo) has gradients of ~3, whose
        # near-zero entries then differ by up to ~1e-6 (9.5e-7 measured over 80 seeds of plain GRPO against TRL).
        atol = max(1e-7, gradient_share * expected.abs().max().item())
        torch.testing.assert_close(our_grads[name], expected, rtol=1e-4, atol=atol, msg=name)
