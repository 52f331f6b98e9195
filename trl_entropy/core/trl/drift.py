"""Guards against TRL drift: every private name of ``trl.GRPOTrainer`` and ``transformers.Trainer`` that
``core/trl/bridge.py`` uses (the only module that uses any), what it is used for and when it is checked, and a check of
the first training step.

A TRL release that renames one of these names, changes a method's parameters, or stops calling a method would
otherwise let training go on silently without the entropy control, or fail somewhere deep inside TRL. The guards fail
loudly instead, naming the installed TRL version and the name.

When each name is checked:

* ``"construction"``: methods and class attributes are checked on the class before TRL's set-up (a trainer that
  cannot apply its control should not load a model first); instance attributes exist only once TRL's ``__init__`` has
  set them, so they are checked on the trainer right after it.
* ``"first use"``: pass@k (``evaluation/passk.py``) samples with any ``trl.GRPOTrainer``, not only ours, and the GRPO
  citation is read when a method module is imported, so these are checked where they are used. The pass@k names are
  also checked at construction of our trainers.

Beyond the names, one behaviour is checked on every generation batch of a trainer that keeps the rollout entropy
(``needs_rollout_entropy``): TRL's ``old_per_token_logps`` is the very tensor one call of the bridge's
``_get_per_token_logps_and_entropies`` returned, so that call's entropy is the rollout policy's, and TRL computed it
wherever its own rule says it does (:func:`check_rollout_entropy`).
"""

import inspect
from dataclasses import dataclass
from importlib.metadata import version

from transformers import TrainerCallback


@dataclass(frozen=True)
class PrivateName:
    """How ``core/trl/bridge.py`` uses one private name of TRL's or Trainer's.

    ``kind`` is ``"method"``, ``"attribute"`` (set on the trainer by TRL's ``__init__``) or ``"class attribute"``;
    ``use`` completes "which trl_entropy …"; ``parameters`` are the leading parameters (after ``self``) a method is
    called or overridden with (later ones may be added); ``checked`` is ``"construction"`` or ``"first use"``.
    """

    kind: str
    use: str
    parameters: tuple[str, ...] = ()
    checked: str = "construction"


OVERRIDE = "overrides to apply its entropy control; training would run without it"
RENAMED_WEIGHTS = "overrides to load a checkpoint's renamed weights (a VLM's); a resumed run would train on its start"
OVERRIDES = (OVERRIDE, RENAMED_WEIGHTS)
ENTROPY_BONUS = "reads and writes to compute TRL's entropy bonus (entropy_coef, use_adaptive_entropy)"
PASS_AT_K = "uses to sample and score pass@k's completions"

PRIVATE_NAMES: dict[str, PrivateName] = {
    "_calculate_rewards": PrivateName("method", OVERRIDE, ("inputs", "prompts", "completions", "completion_ids_list")),
    "_generate_and_score_completions": PrivateName("method", OVERRIDE, ("inputs",)),
    "_get_per_token_logps_and_entropies": PrivateName(
        "method",
        OVERRIDE,
        (
            "model",
            "input_ids",
            "attention_mask",
            "logits_to_keep",
            "batch_size",
            "compute_entropy",
            "compute_aux_loss",
        ),
    ),
    "_compute_loss": PrivateName("method", OVERRIDE, ("model", "inputs")),
    "_save_checkpoint": PrivateName("method", OVERRIDE, ("model", "trial")),
    "_load_optimizer_and_scheduler": PrivateName("method", OVERRIDE, ("checkpoint",)),
    "_load_from_checkpoint": PrivateName("method", RENAMED_WEIGHTS, ("resume_from_checkpoint", "model")),
    "_get_output_dir": PrivateName("method", "calls to find the checkpoint folder it writes into", ("trial",)),
    "_tokenize_prompts": PrivateName("method", PASS_AT_K, ("prompts",)),
    "_generate_single_turn": PrivateName(
        "method", PASS_AT_K, ("prompt_ids", "images", "multimodal_fields", "num_generations")
    ),
    "_tag_names": PrivateName("class attribute", "overrides to tag the model and its card with trl-entropy"),
    "_name": PrivateName("class attribute", "overrides to name each method on its model card"),
    "_paper": PrivateName(
        "class attribute",
        "reads and overrides to cite GRPO's paper and each method's on the model card",
        checked="first use",
    ),
    "_metrics": PrivateName("attribute", "appends its metrics to"),
    "_logs": PrivateName("attribute", "writes the method's advantages into (the completions table)"),
    "_step": PrivateName("attribute", "saves and restores to resume inside a generation cycle"),
    "_buffered_inputs": PrivateName("attribute", "saves and restores to resume inside a generation cycle"),
    "_entropy_bonus_enabled": PrivateName("attribute", ENTROPY_BONUS),
    "_entropy_window_stats": PrivateName("attribute", ENTROPY_BONUS),
    "_last_world_entropy": PrivateName("attribute", ENTROPY_BONUS),
    "_pending_metrics": PrivateName("attribute", "clears after pass@k, whose reward calls fill it"),
    "_pending_extra_logs": PrivateName("attribute", "clears after pass@k, whose reward calls fill it"),
}
# Set by TRL's __init__: checked on the trainer right after it.
INSTANCE_ATTRIBUTES = tuple(name for name, private in PRIVATE_NAMES.items() if private.kind == "attribute")
# What pass@k uses on any GRPO trainer (checked at its first use; ours also at construction).
PASS_AT_K_NAMES = (
    "_tokenize_prompts",
    "_generate_single_turn",
    "_calculate_rewards",
    "_pending_metrics",
    "_pending_extra_logs",
)


def trl_version() -> str:
    return version("trl")


def drift_error(kind: str, name: str, problem: str) -> RuntimeError:
    return RuntimeError(
        f"trl=={trl_version()}: {problem}, which trl_entropy {PRIVATE_NAMES[name].use}. Install a supported TRL "
        f"version (see setup.py) or update trl_entropy/core/trl/bridge.py (the {kind} {name})."
    )


def check_method(owner: type, name: str, method) -> None:
    """``method`` (``owner``'s ``name``) is callable and takes the expected leading parameters."""
    expected = PRIVATE_NAMES[name].parameters
    if not callable(method):
        raise drift_error("method", name, f"GRPOTrainer no longer has the method {name}")
    parameters = tuple(inspect.signature(method).parameters)[1:]
    position = next((i for i, want in enumerate(expected) if parameters[i : i + 1] != (want,)), None)
    if position is not None:
        found = repr(parameters[position]) if position < len(parameters) else "missing"
        raise RuntimeError(
            f"trl=={trl_version()}: {owner.__name__}.{name} now takes {parameters}, but trl_entropy calls or "
            f"overrides it expecting {expected}: its parameter {expected[position]!r} (position {position + 1}) is "
            f"{found}; training would not apply the entropy control as written. Install a supported TRL version (see "
            "setup.py) or update trl_entropy/core/trl/bridge.py."
        )


def check_class(trainer_class: type, bridge: type) -> None:
    """Raise RuntimeError unless every method and class attribute checked at construction is still defined by a class
    that ``bridge`` (a base of ``trainer_class``) reaches through ``super()`` (TRL's ``GRPOTrainer`` or
    ``transformers.Trainer``), methods with the expected leading parameters."""
    mro = trainer_class.__mro__
    parents = mro[mro.index(bridge) + 1 :]
    for name, private in PRIVATE_NAMES.items():
        if private.kind == "attribute" or private.checked != "construction":
            continue
        owner = next((klass for klass in parents if name in vars(klass)), None)
        if private.kind == "class attribute":
            if owner is None:
                raise drift_error(private.kind, name, f"GRPOTrainer no longer has the class attribute {name}")
            continue
        check_method(owner, name, None if owner is None else vars(owner)[name])


def check_trainer(trainer, names) -> None:
    """Raise RuntimeError unless ``trainer`` (any ``trl.GRPOTrainer``) still has every private name of ``names``:
    attributes set, methods with the expected leading parameters."""
    for name in names:
        private = PRIVATE_NAMES[name]
        if private.kind == "method":
            check_method(type(trainer), name, getattr(type(trainer), name, None))
        elif not hasattr(trainer, name):
            raise drift_error(private.kind, name, f"GRPOTrainer no longer sets the attribute {name}")


def check_grpo_citation(grpo_trainer_class: type) -> None:
    """GRPO's ``_paper`` still holds the citation every method's card puts after its own."""
    if "citation" not in getattr(grpo_trainer_class, "_paper", {}):
        raise drift_error("class attribute", "_paper", "GRPOTrainer no longer has the class attribute _paper")


def check_rollout_entropy(has_old_log_probs: bool, matched: bool, expected: bool) -> None:
    """Raise RuntimeError unless the rollout entropy can be read off TRL's generation batch: ``old_per_token_logps``
    present wherever TRL's rule computes it (``expected``: ``gradient_accumulation_steps`` not a multiple of
    ``steps_per_generation * num_iterations``, or vLLM's importance-sampling correction), and ``matched``: returned by
    a call of the bridge's ``_get_per_token_logps_and_entropies`` (whose entropy is then the rollout policy's)."""
    fix = "Install a supported TRL version (see setup.py) or update trl_entropy/core/trl/bridge.py."
    if expected and not has_old_log_probs:
        raise RuntimeError(
            f"trl=={trl_version()}: _generate_and_score_completions made a generation batch without "
            "old_per_token_logps where TRL's rule computes them (the updates are off-policy), so the rollout "
            f"policy's entropy, computed in the same pass, is missing too. {fix}"
        )
    if has_old_log_probs and not matched:
        raise RuntimeError(
            f"trl=={trl_version()}: the old_per_token_logps of _generate_and_score_completions did not come from "
            "_get_per_token_logps_and_entropies, whose entropy would be the rollout policy's: TRL computes them by "
            f"another path, and the rollout entropy cannot be read. {fix}"
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
                f"trl=={trl_version()}: the first training step did not go through EntropyGRPOTrainer._compute_loss "
                "(and its entropy head): this TRL computes the GRPO loss by another path, so the entropy control "
                "would silently not apply. Install a supported TRL version (see setup.py) or update "
                "trl_entropy/core/trl/bridge.py."
            )
