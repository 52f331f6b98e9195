"""The one module that reaches into ``trl.GRPOTrainer`` and ``transformers.Trainer``: it overrides their private
methods, reads and writes their private attributes and calls their private helpers, and offers the rest of the
library what it needs under its own names. Every private name used here is listed, with what it is used for, in
``core/trl/drift.py``, which checks them all (a test keeps the two in step).

:class:`TRLBridge` is the base of ``EntropyGRPOTrainer`` (``core/trainer.py``). TRL's private methods lead to:

* ``_compute_loss``                      → ``loss_step(model, inputs)``;
* ``_get_per_token_logps_and_entropies`` → ``score_tokens(...)``, the entropy head (rollout and reference log-probs);
* ``_calculate_rewards``                 → ``on_rewards(rewards_per_func)``, every rank's rewards;
* ``_generate_and_score_completions``    → ``finish_generation_batch(output, rows)``, with the rollout policy's
  entropy kept for a trainer whose method reads it (``needs_rollout_entropy``);
* ``_save_checkpoint``                  → ``before_checkpoint_save(folder)`` and ``after_checkpoint_save(folder)``
  around Trainer's save;
* ``_load_optimizer_and_scheduler``     → ``after_checkpoint_load(checkpoint)``;
* ``_load_from_checkpoint``             → also ``core/weights.py`` (a VLM's renamed weights).

Under our names: :attr:`TRLBridge.mode`, :meth:`TRLBridge.record_metric`, :attr:`TRLBridge.micro_step` and
:attr:`TRLBridge.buffered_generation_batch` (where a generation cycle stands, for checkpoints),
:meth:`TRLBridge.replace_logged_advantages`, :meth:`TRLBridge.trl_entropy_bonus`,
:meth:`TRLBridge.step_trl_entropy_coef` and :meth:`TRLBridge.rollout_entropy`; for any GRPO trainer,
:func:`generate_and_score` and :func:`discard_reward_logs` (pass@k); for a trainer class, :func:`model_card_of`,
:func:`model_card_tags`, :func:`set_model_card` and :func:`grpo_citation`.
"""

import os

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer
from trl.data_utils import is_conversational

from ..batch import OLD_ENTROPY_KEY
from ..multimodal import check_known_inputs
from ..statistics import masked_mean, replace_tail
from ..weights import load_renamed_weights
from .drift import (
    INSTANCE_ATTRIBUTES,
    PASS_AT_K_NAMES,
    LossPathGuard,
    check_class,
    check_grpo_citation,
    check_rollout_entropy,
    check_trainer,
)
from .objectives import adaptive_entropy_coef_step
from .vllm import check_plain_weights, check_vllm_arguments, plain_cpu_weights, vllm_on_cpu


class TRLBridge(GRPOTrainer):
    """``trl.GRPOTrainer`` whose private methods lead to named methods of the trainer built on it (see the module
    docstring), with TRL's private state offered under our names. Every private name it uses is checked when a
    trainer is built."""

    _tag_names = ["trl", "grpo", "trl-entropy"]
    # True where a method reads the rollout policy's entropy (CompletionBatch.old_entropy): only then is it kept from
    # the pass that computes TRL's old_per_token_logps and carried with the generation batch (OLD_ENTROPY_KEY).
    needs_rollout_entropy: bool = False

    def __init__(self, model, reward_funcs=None, args=None, *positional, **keyword):
        check_class(type(self), TRLBridge)
        self._scoring_calls = None  # (log-probs, entropy) of each scoring call, while a generation batch is made
        if args.use_vllm:
            check_vllm_arguments(args, model)
        colocated_on_cpu = args.use_vllm and args.vllm_mode == "colocate" and vllm_on_cpu()
        with plain_cpu_weights(colocated_on_cpu):
            super().__init__(model, reward_funcs, args, *positional, **keyword)
        check_trainer(self, INSTANCE_ATTRIBUTES + PASS_AT_K_NAMES)
        if colocated_on_cpu:
            check_plain_weights(self.vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner.model)
        self.loss_path = LossPathGuard()  # fails the first step if TRL stopped routing the loss through this class
        self.add_callback(self.loss_path)

    # ------------------------------------------------------------------------------------------------------------
    # TRL's state under our names
    # ------------------------------------------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """``"train"`` or ``"eval"``: the metric dict the current step logs into."""
        return "train" if self.model.training else "eval"

    def record_metric(self, mode: str, name: str, value: float) -> None:
        """Add ``value`` to metric ``name``; TRL logs the mean of a logging step's values."""
        self._metrics[mode][name].append(value)

    @property
    def micro_step(self) -> int:
        """TRL's micro-batch counter: where the buffered generation batch is in its generation cycle."""
        return self._step

    @micro_step.setter
    def micro_step(self, value: int) -> None:
        self._step = value

    @property
    def buffered_generation_batch(self):
        """The generation batch the rest of the cycle trains on (None: the next step generates one)."""
        return self._buffered_inputs

    @buffered_generation_batch.setter
    def buffered_generation_batch(self, value) -> None:
        self._buffered_inputs = value

    def replace_logged_advantages(self, advantages: list[float]) -> None:
        """Show ``advantages`` (every rank's, this generation batch) in the completions table instead of TRL's."""
        replace_tail(self._logs["advantages"], advantages)

    @property
    def entropy_bonus_enabled(self) -> bool:
        """Whether TRL's entropy bonus applies (``entropy_coef`` ≠ 0 or ``use_adaptive_entropy``, fixed by TRL when it
        is built), or a schedule of its coefficient has a value other than 0 (a warm-up from 0 included)."""
        return self._entropy_bonus_enabled or self.args.entropy_schedule().ever_nonzero

    def trl_entropy_bonus(self, entropy, mask, coefficient=None) -> torch.Tensor:
        """TRL's own entropy bonus (``entropy_coef``, Skywork-OR1's ``use_adaptive_entropy``), the EntReg baseline:
        ``coef · mean entropy`` over ``mask`` (the caller subtracts it, scaled for accumulation), with ``coefficient``
        where given (a schedule's value), else the coefficient as it stands before this micro-batch's
        :meth:`step_trl_entropy_coef`."""
        coefficient = self.entropy_coef if coefficient is None else coefficient
        if self.use_adaptive_entropy and self._last_world_entropy > self.args.entropy_target:
            coefficient = 0.0
        return coefficient * masked_mean(entropy, mask)

    def step_trl_entropy_coef(self, entropy, mask) -> None:
        """TRL's adaptive entropy coefficient, a controller of TRL's with its state in TRL's attributes (so TRL's own
        checkpoint file for it keeps working): each training micro-batch adds its entropy over ``mask``; at every
        optimizer step the coefficient moves by ``adaptive_entropy_coef_step`` on the mean over all ranks."""
        if self.use_adaptive_entropy:
            window = torch.stack([(entropy * mask).sum(), mask.sum()]).detach()
            previous = self._entropy_window_stats
            self._entropy_window_stats = window if previous is None else previous + window
            if self.accelerator.sync_gradients:
                totals = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
                self._last_world_entropy = (totals[0] / totals[1].clamp(min=1.0)).item()
                args = self.args
                self.entropy_coef = adaptive_entropy_coef_step(
                    self.entropy_coef,
                    self._last_world_entropy,
                    args.entropy_target,
                    args.entropy_coef_delta,
                    args.entropy_coef_min,
                    args.entropy_coef_max,
                )
                self._entropy_window_stats = None
        if self.accelerator.sync_gradients:
            self.record_metric("train", "entropy_coef", self.entropy_coef)

    def rollout_entropy(self, inputs: dict, entropy: torch.Tensor) -> torch.Tensor | None:
        """``H^old`` of a micro-batch for a trainer that reads it (None for any other): the rollout policy's entropy
        carried with the generation batch, or, where TRL computed no rollout log-probs (on-policy), ``entropy`` (this
        pass's) detached."""
        if not self.needs_rollout_entropy:
            return None
        if inputs.get(OLD_ENTROPY_KEY) is not None:
            return inputs[OLD_ENTROPY_KEY]
        if inputs.get("old_per_token_logps") is not None:  # off-policy: this pass's entropy is not the rollout's
            raise ValueError(
                f"{type(self).__name__} reads the rollout policy's entropy, but this micro-batch holds TRL's rollout "
                f"log-probs without it (no {OLD_ENTROPY_KEY!r}): its generation batch was made by a trainer that does "
                f"not keep it (a checkpoint of another method, or a hand-built batch: add {OLD_ENTROPY_KEY!r})."
            )
        return entropy.detach()

    def keep_rollout_entropy(self, output: dict, calls: list) -> None:
        """Put the rollout policy's entropy into TRL's generation batch ``output`` under ``OLD_ENTROPY_KEY``: the
        entropy of the scoring call whose log-probs TRL kept as ``old_per_token_logps``. That tensor's identity tells
        the policy's call from the reference model's (same tokens; the same module when a LoRA adapter is switched off
        for it). On-policy TRL computes no rollout log-probs, and nothing is added."""
        old_log_probs = output.get("old_per_token_logps")
        entropy = next((h for log_probs, h in calls if log_probs is old_log_probs), None)
        generate_every = self.args.steps_per_generation * self.num_iterations
        expected = self.args.gradient_accumulation_steps % generate_every != 0 or (
            self.use_vllm and self.vllm_importance_sampling_correction
        )
        check_rollout_entropy(old_log_probs is not None, entropy is not None, expected)
        if old_log_probs is not None:
            output[OLD_ENTROPY_KEY] = entropy.detach()

    # ------------------------------------------------------------------------------------------------------------
    # What the trainer built on this class provides
    # ------------------------------------------------------------------------------------------------------------

    def loss_step(self, model, inputs):
        """One micro-batch's loss step: an object with the ``loss``."""
        raise NotImplementedError

    def after_loss_step(self, step) -> None:
        """Sees what ``loss_step`` returned, after it."""

    def before_checkpoint_save(self, folder: str) -> None:
        """On every rank, before Trainer saves the checkpoint into ``folder`` (and pushes it to the Hub): what Trainer
        does not save goes in here."""

    def after_checkpoint_save(self, folder: str) -> None:
        """On every rank, once Trainer has saved ``folder``."""

    def after_checkpoint_load(self, checkpoint: str) -> None:
        """On every rank, once Trainer has restored its own state from ``checkpoint``."""

    def score_tokens(self, model, input_ids, attention_mask, logits_to_keep, **options):
        """Per-token log-probs, entropies, clamped entropies and the MoE router loss, a ``ScoredCompletions``
        (``options``: ``batch_size``, ``clamp_fraction``, ``aux_loss``, ``multimodal``, a VLM's image inputs)."""
        raise NotImplementedError

    def on_rewards(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """Sees every rank's rewards ``(N, functions)`` of a generation batch; returns them."""
        return rewards_per_func

    def finish_generation_batch(self, output: dict, rows: int) -> dict:
        """Sees TRL's generation batch (this rank's ``rows`` prompts); returns it."""
        return output

    # ------------------------------------------------------------------------------------------------------------
    # Overrides of TRL's GRPOTrainer
    # ------------------------------------------------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        return self.on_rewards(super()._calculate_rewards(inputs, prompts, completions, completion_ids_list))

    def _generate_and_score_completions(self, inputs):
        if not self.needs_rollout_entropy:
            return self.finish_generation_batch(super()._generate_and_score_completions(inputs), len(inputs))
        self._scoring_calls = []  # filled by _get_per_token_logps_and_entropies while TRL makes this batch
        try:
            output = super()._generate_and_score_completions(inputs)
            calls = self._scoring_calls
        finally:
            self._scoring_calls = None
        self.keep_rollout_entropy(output, calls)
        return self.finish_generation_batch(output, len(inputs))

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **model_inputs,
    ):
        # TRL calls this for the rollout and reference log-probs; the same kernel scores them as the loss does, so the
        # on-policy ratio is exactly 1. A VLM's multimodal inputs come as keywords, each slice cut from them.
        check_known_inputs(model_inputs)
        scored = self.score_tokens(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size=batch_size,
            aux_loss=compute_aux_loss,
            multimodal=model_inputs,
        )
        if self._scoring_calls is not None:  # the kernel computed the entropy with the log-probs: keep both
            self._scoring_calls.append((scored.log_probs, scored.entropy))
        return scored.log_probs, (scored.entropy if compute_entropy else None), scored.router_loss

    def _compute_loss(self, model, inputs):
        step = self.loss_step(model, inputs)
        self.after_loss_step(step)
        self.loss_path.loss_steps += 1
        return step.loss

    # ------------------------------------------------------------------------------------------------------------
    # Overrides of transformers.Trainer: checkpoints
    # ------------------------------------------------------------------------------------------------------------

    def _save_checkpoint(self, model, trial):
        # Our files go into the checkpoint folder before Trainer's own save, which pushes the folder to the Hub.
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        self.before_checkpoint_save(folder)
        super()._save_checkpoint(model, trial)
        self.after_checkpoint_save(folder)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        if not self.is_fsdp_enabled:  # FSDP loads its own sharded state; DeepSpeed never comes here
            load_renamed_weights(self.model if model is None else model, resume_from_checkpoint)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self.after_checkpoint_load(checkpoint)


# ---------------------------------------------------------------------------------------------------------------------
# For any GRPO trainer
# ---------------------------------------------------------------------------------------------------------------------


def generate_and_score(trainer: GRPOTrainer, inputs: list[dict], num_samples: int) -> torch.Tensor:
    """Sample a completion for each row of ``inputs`` (``num_samples`` consecutive copies of each prompt) through
    ``trainer``'s own generation path (TRL's ``_tokenize_prompts`` and ``_generate_single_turn``: its sampling
    settings, chat template and backend) and score it with its reward functions: every rank's rewards
    ``(N, functions)``, NaN where a function returned None. Check ``PASS_AT_K_NAMES`` first (``core.drift``)."""
    prompts = [row["prompt"] for row in inputs]
    prompt_ids, images, multimodal_fields = trainer._tokenize_prompts(prompts)
    completion_ids, _ = trainer._generate_single_turn(prompt_ids, images, multimodal_fields, num_samples)
    texts = trainer.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
    if is_conversational({"prompt": prompts[0]}):
        completions = [[{"role": "assistant", "content": text}] for text in texts]
    else:
        completions = texts
    return trainer._calculate_rewards(inputs, prompts, completions, completion_ids)


def discard_reward_logs(trainer: GRPOTrainer) -> None:
    """Drop what reward functions passed to ``log_extra`` or ``log_metric`` since the last generation batch."""
    trainer._pending_extra_logs.clear()
    trainer._pending_metrics.clear()


def model_card_of(trainer_class: type) -> tuple[str, list[str]]:
    """The method a trainer class's model card names and the tags it carries (TRL's ``_name`` and ``_tag_names``)."""
    return trainer_class._name, trainer_class._tag_names


def model_card_tags(*tags: str) -> list[str]:
    """The tags a trainer's model card carries: the base's (TRL's and ours), then ``tags``."""
    return [*TRLBridge._tag_names, *tags]


def set_model_card(trainer_class: type, name: str, paper: dict[str, str], tags: str | list[str]) -> None:
    """Make the model card of ``trainer_class`` say "trained with ``name``", cite ``paper`` (``title``, ``id`` and
    ``citation``, as TRL reads them; the title and id may be left out) and tag the model with ``tags`` after the base's
    tags."""
    trainer_class._name = name
    trainer_class._paper = paper
    trainer_class._tag_names = model_card_tags(*([tags] if isinstance(tags, str) else tags))


def grpo_citation() -> str:
    """GRPO's BibTeX entry (DeepSeekMath), as TRL's model card cites it."""
    check_grpo_citation(GRPOTrainer)
    return GRPOTrainer._paper["citation"]
