"""Guards against TRL drift: the private methods of ``trl.GRPOTrainer`` and ``transformers.Trainer`` that
``EntropyGRPOTrainer`` overrides, with the parameters it expects them to have, and a check of the first training step.

A TRL release that renames one of these methods, changes its parameters, or stops calling it would otherwise let
training go on silently without the method's control (TRL is moving its GRPO scoring onto its own chunked log-prob
path). Both guards fail loudly, naming the installed TRL version and the method.
"""

import inspect
from importlib.metadata import version

from transformers import TrainerCallback


# name -> the leading parameters (after self) our override is written against; later parameters may be added.
OVERRIDDEN_METHODS: dict[str, tuple[str, ...]] = {
    "_calculate_rewards": ("inputs", "prompts", "completions", "completion_ids_list"),
    "_generate_and_score_completions": ("inputs",),
    "_get_per_token_logps_and_entropies": (
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
        "compute_aux_loss",
    ),
    "_compute_loss": ("model", "inputs"),
    "_save_checkpoint": ("model", "trial"),
    "_load_optimizer_and_scheduler": ("checkpoint",),
}


def _trl_version() -> str:
    return version("trl")


def check_trl_methods(trainer_class: type) -> None:
    """Raise RuntimeError unless every method in ``OVERRIDDEN_METHODS`` is still defined by a class that
    ``trainer_class``'s overrides call through ``super()`` (TRL's ``GRPOTrainer`` or ``transformers.Trainer``), with
    the expected leading parameters."""
    from .trainer import EntropyGRPOTrainer

    mro = trainer_class.__mro__
    parents = mro[mro.index(EntropyGRPOTrainer) + 1 :]
    for name, expected in OVERRIDDEN_METHODS.items():
        owner = next((klass for klass in parents if name in vars(klass)), None)
        method = None if owner is None else vars(owner)[name]
        if not callable(method):
            raise RuntimeError(
                f"trl=={_trl_version()}: GRPOTrainer no longer has the method {name}, which trl_entropy overrides to "
                "apply its entropy control; training would run without it. Install a supported TRL version "
                "(see setup.py) or update trl_entropy/core/trainer.py."
            )
        parameters = tuple(inspect.signature(method).parameters)[1:]
        position = next((i for i, want in enumerate(expected) if parameters[i : i + 1] != (want,)), None)
        if position is not None:
            found = repr(parameters[position]) if position < len(parameters) else "missing"
            raise RuntimeError(
                f"trl=={_trl_version()}: {owner.__name__}.{name} now takes {parameters}, but trl_entropy overrides it "
                f"expecting {expected}: its parameter {expected[position]!r} (position {position + 1}) is {found}; "
                "training would not apply the entropy control as written. Install a supported TRL version (see "
                "setup.py) or update trl_entropy/core/trainer.py."
            )


class LossPathGuard(TrainerCallback):
    """Fails the first optimizer step unless the trainer's ``_compute_loss`` (our loss, scored by our entropy head)
    computed its loss. The trainer counts ``loss_steps`` there."""

    def __init__(self):
        self.loss_steps = 0
        self.checked = False

    def on_step_end(self, args, state, control, **kwargs):
        if self.checked:
            return
        self.checked = True
        if self.loss_steps == 0:
            raise RuntimeError(
                f"trl=={_trl_version()}: the first training step did not go through EntropyGRPOTrainer._compute_loss "
                "(and its entropy head): this TRL computes the GRPO loss by another path, so the entropy control "
                "would silently not apply. Install a supported TRL version (see setup.py) or update "
                "trl_entropy/core/trainer.py."
            )
