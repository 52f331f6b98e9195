"""``EntropyGRPOTrainer``: the shared base. It owns GRPO's loss step and opens it through small hooks. It stands on
``core/trl_bridge.py``'s ``TRLBridge``, the one place that touches the private methods and attributes of
``trl.GRPOTrainer`` and ``transformers.Trainer``; this module uses only the names the bridge offers.

The hooks a method fills are defined below in the order they run; docs/adding_a_method.md draws them beside the
steps of ``loss_step`` and walks through them.

The advantages go by two names: ``batch.group_advantages`` (one per completion, its reward against its group's
baseline, made once per generation batch) and ``token_advantages`` (what ``per_token_advantages`` makes of them, per
sequence or per token; the surrogate multiplies exactly these). TRL's off-policy gate reads the group advantages.

With no hook overridden it computes exactly ``trl.GRPOTrainer``'s loss, TRL's own entropy bonus (``entropy_coef``,
``use_adaptive_entropy``) and a Mixture-of-Experts model's router load-balancing loss included. Controller state and
the progress of the current generation cycle travel in every checkpoint (``trainer_state.json``), pushed ones
included, and are restored by ``resume_from_checkpoint``, also in the middle of a cycle.
"""

from typing import ClassVar

import torch
from accelerate.utils import is_peft_model

from .advantages import group_advantages, summed_rewards
from .batch import CompletionBatch
from .checkpoint import last_complete_checkpoint, tied_weights_not_reported_missing
from .config import EntropyGRPOConfig
from .control import Controller, ControllerCycle, EntropyControlState
from .data import check_image_columns, check_prompt_columns
from .head import (
    EntropyHeadRequest,
    ScoredCompletions,
    install_entropy_head,
    score_completions,
    unsupported_head_reason,
    unsupported_head_reason_at,
)
from .objectives import TOKEN_SUM_LOSS_TYPES, aggregate_loss, k3_kl
from .statistics import global_token_mean, loss_step_metrics
from .surrogates import importance_ratio, policy_surrogate, vespo_weights
from .trl_bridge import TRLBridge


class EntropyGRPOTrainer(TRLBridge):
    """`trl.GRPOTrainer` whose loss step is owned here and opened up through small hooks (see the module docstring).

    Takes the same arguments as `trl.GRPOTrainer`; `args` is an `EntropyGRPOConfig` (or the method's config, or a
    plain `GRPOConfig`, converted)."""

    config_class: ClassVar[type] = EntropyGRPOConfig
    # Per-token (B, T) tensors that on_generation_batch adds to the generation batch and the loss step reads back.
    carried_token_keys: ClassVar[tuple[str, ...]] = ()

    def __new__(cls, model=None, reward_funcs=None, args=None, *positional, **keyword):
        # `EntropyGRPOTrainer(args=EntropyGRPOConfig(entropy_control=[...]))` builds the trainer of those methods.
        combined = args.trainer_class() if isinstance(args, EntropyGRPOConfig) else None
        if cls is EntropyGRPOTrainer and combined is not None:
            cls = combined
        return super().__new__(cls)

    def __init__(self, model, reward_funcs=None, args=None, *positional, **keyword):
        args = self.config_class.coerce(args, type(self).__name__, model)
        combined = args.trainer_class()
        if combined is not None and not isinstance(self, combined):
            raise TypeError(
                f"{type(self).__name__} cannot train entropy_control={args.entropy_control!r}: its trainer is "
                f"{combined.__name__}. Pass the config to EntropyGRPOTrainer, which builds that trainer."
            )
        # Before TRL's set-up, which fails obscurely on a model the head cannot score (a bare backbone).
        if isinstance(model, str):  # model_init_kwargs' trust_remote_code wins over the config's, as in TRL
            trust_remote_code = (args.model_init_kwargs or {}).get("trust_remote_code", args.trust_remote_code)
            reason = unsupported_head_reason_at(model, trust_remote_code)
        else:
            reason = unsupported_head_reason(model)
        if reason is not None:
            raise ValueError(reason)
        super().__init__(model, reward_funcs, args, *positional, **keyword)
        if self.environment_factories is None:  # an environment supplies the prompts itself (TRL)
            check_prompt_columns(self.train_dataset, self.eval_dataset)
        check_image_columns(self.train_dataset, self.eval_dataset, self.model, self.processing_class)
        policy = self.model.get_base_model() if is_peft_model(self.model) else self.model
        install_entropy_head(policy, self.temperature, args.cast_lm_head_to_fp32)
        if self.ref_model is not None:
            install_entropy_head(self.ref_model, self.temperature, args.cast_lm_head_to_fp32)
        self.controller_cycle = ControllerCycle(
            self.build_controllers(),
            micro_batches_per_cycle=args.steps_per_generation * self.num_iterations,
            accumulation_steps=args.gradient_accumulation_steps,
            reduce_sum=lambda sums: self.accelerator.reduce(sums, reduction="sum"),
        )
        self.controllers: dict[str, Controller] = self.controller_cycle.controllers
        self._entropy_control_state = EntropyControlState()  # carries the controller state into every checkpoint
        self.add_callback(self._entropy_control_state)

    # ------------------------------------------------------------------------------------------------------------
    # Hooks
    # ------------------------------------------------------------------------------------------------------------

    def build_controllers(self) -> list[Controller]:
        """The controllers of the trainer's methods (none in plain GRPO). A method returns ``super()``'s followed by
        its own, so that combined methods each keep theirs."""
        return []

    def group_baseline(self, grouped_rewards: torch.Tensor) -> torch.Tensor | None:
        """The baseline ``(groups,)`` of each prompt group of rewards ``(groups, num_generations)`` gathered from every
        rank (NaN: unscorable), the same on every rank; TRL's scaling then applies around it. None keeps TRL's mean."""
        return None

    def on_generation_batch(self, batch: dict) -> None:
        """Called on every generation batch TRL makes (training and evaluation), on every rank, before TRL splits it
        into micro-batches; it may add ``(B, T)`` tensors under ``carried_token_keys``. Collectives are allowed."""

    def clamp_fraction(self) -> float:
        """Fraction of the vocabulary dropped for the clamped entropy; 0 means the loss needs no clamped entropy."""
        return 0.0

    def per_token_advantages(self, batch: CompletionBatch) -> torch.Tensor:
        """The token advantages the surrogate multiplies, made from ``batch.group_advantages``: ``(B, 1)`` (one per
        sequence) or ``(B, T)`` (one per token), no gradient."""
        return batch.group_advantages

    def per_token_policy_loss(
        self, batch: CompletionBatch, ratio: torch.Tensor, token_advantages: torch.Tensor
    ) -> torch.Tensor:
        """Per-token surrogate of ``loss_type`` (``core/surrogates.py``): ``−min(r·A, clip(r, 1−ε_low, 1+ε_high)·A)``
        with TRL's two-sided ``delta`` clip for the clipped losses; CISPO's, SAPO's or VESPO's otherwise."""
        phi = None
        if self.loss_type == "vespo":
            ratios = batch.importance_sampling_ratio
            phi = vespo_weights(batch.log_probs, batch.old_log_probs, token_advantages, batch.mask, ratios, self.args)
            self.log_token_mean(batch, "vespo/phi_seq_mean", phi)
        clip_range = self.clip_range()
        return policy_surrogate(self.loss_type, batch.log_probs, ratio, token_advantages, clip_range, self.args, phi)

    def clip_range(self) -> tuple[float, float]:
        """``(ε_low, ε_high)`` of the PPO clip."""
        return self.epsilon_low, self.epsilon_high

    def regulariser(self, batch: CompletionBatch) -> torch.Tensor | None:
        """A scalar added to the loss of each micro-batch, before the base divides it by the accumulation steps."""
        return None

    def rank_checkpoint_state(self) -> dict[str, object]:
        """This rank's extra state for a checkpoint: ``{file name pattern with {process_index}: value}``."""
        return {}

    def restore_rank_checkpoint_state(self, checkpoint: str) -> None:
        """Read back what ``rank_checkpoint_state`` saved (``core.checkpoint.load_rank_file``)."""

    def log_token_mean(self, batch: CompletionBatch, name: str, values: torch.Tensor) -> None:
        """Log the token mean of ``values`` over every rank's valid tokens as metric ``name`` (collective)."""
        self.record_metric(batch.mode, name, global_token_mean(self.accelerator, values, batch.mask))

    # ------------------------------------------------------------------------------------------------------------
    # What TRL's generation and loss paths lead to (core/trl_bridge.py)
    # ------------------------------------------------------------------------------------------------------------

    def on_rewards(self, rewards_per_func):
        """TRL's rewards, refusing infinite ones.

        TRL maps a ``None`` (or NaN) reward to NaN and leaves such completions out of the group statistics; that stays.
        An infinite reward has no such meaning: it makes the group's advantages NaN (silently zeroed) or, with
        ``scale_rewards="none"``, ±3.4e38, which turns the weights into NaN. The rewards are gathered across ranks
        here, so every rank raises together.
        """
        infinite = torch.isinf(rewards_per_func)
        if infinite.any():
            row, column = infinite.nonzero()[0].tolist()
            raise ValueError(
                f"reward function {self.reward_func_names[column]!r} returned {rewards_per_func[row, column].item()} "
                f"for completion {row} of the generation batch ({int(infinite.sum())} infinite rewards in all). "
                "Rewards must be finite; return None for a completion the function cannot score."
            )
        self._gathered_rewards = rewards_per_func  # every rank's rows, for group_baseline
        return rewards_per_func

    def finish_generation_batch(self, output, rows):
        """TRL's advantages around the method's ``group_baseline`` (when it has one), then ``on_generation_batch``."""
        num_generations = self.num_generations if self.model.training else self.num_generations_eval
        rewards = summed_rewards(self._gathered_rewards, self.reward_weights)
        baseline = self.group_baseline(rewards.view(-1, num_generations))
        if baseline is not None:  # TRL's advantages around the method's baseline; this rank's rows, as TRL slices them
            if self.multi_objective_aggregation != "sum_then_normalize":
                raise ValueError(f"{type(self).__name__} needs multi_objective_aggregation='sum_then_normalize'.")
            advantages = group_advantages(rewards, num_generations, self.scale_rewards, baseline)
            output["advantages"] = advantages[self.accelerator.process_index * rows :][:rows]
            self.replace_logged_advantages(advantages.tolist())  # the completions table shows them too
        self.on_generation_batch(output)
        return output

    def _score(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        clamp_fraction=0.0,
        aux_loss=False,
        multimodal=None,
    ):
        """Per-token log-probs, entropies, clamped entropies (when ``clamp_fraction > 0``), the MoE router loss (when
        ``aux_loss``) of the last ``logits_to_keep`` positions, from the entropy head; a VLM's ``multimodal`` too."""
        request = EntropyHeadRequest(
            logits_to_keep=logits_to_keep,
            clamp_fraction=clamp_fraction,
            chunk_size=self.args.entropy_kernel_chunk_size,
            backend=self.args.entropy_kernel_backend,
            compute_aux_loss=aux_loss,
        )
        scored = score_completions(
            model, input_ids, attention_mask, request, batch_size, self.accelerator.autocast, multimodal
        )
        return scored.log_probs, scored.entropy, scored.clamped_entropy, scored.router_loss

    def loss_step(self, model, inputs):
        """GRPO's loss of one micro-batch, step by step in the order they run (docs/adding_a_method.md draws them with
        the hooks each step calls). Logs the step's metrics."""
        scored = self.score_micro_batch(model, inputs)  # 1. score
        batch = self.completion_batch(inputs, scored)  # 2. batch
        # 3. group baseline: once per generation batch (finish_generation_batch), giving batch.group_advantages
        token_advantages = self.per_token_advantages(batch)  # 4. per-token advantages
        ratio = importance_ratio(batch.log_probs, batch.old_log_probs, batch.mask, self.importance_sampling_level)
        per_token_loss = self.per_token_policy_loss(batch, ratio, token_advantages)  # 5. surrogate
        per_token_loss = self.apply_token_gates(batch, per_token_loss, inputs)  # 6. stop-gradient gates
        per_token_kl = self.reference_kl(batch, ratio, inputs)  # 7. KL
        if per_token_kl is not None:
            per_token_loss = per_token_loss + self.beta * per_token_kl
        policy_loss, loss = self.aggregate(batch, per_token_loss, inputs)  # 8. aggregation
        loss = self.add_regularisers(batch, loss, policy_loss, scored.router_loss)  # 9. regularisers
        self.update_controllers(batch)  # 10. controllers
        self.record_loss_step_metrics(batch, token_advantages, ratio, per_token_kl)  # 11. metrics
        return loss

    def score_micro_batch(self, model, inputs) -> ScoredCompletions:
        """Step 1: the completion tokens' log-probs, entropies, clamped entropies (``clamp_fraction()``) and the MoE
        router loss, from the entropy head (a vision-language model's images passed on as TRL passes them)."""
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        log_probs, entropy, clamped_entropy, router_loss = self._score(
            model,
            torch.cat([inputs["prompt_ids"], completion_ids], dim=1),
            torch.cat([inputs["prompt_mask"], completion_mask], dim=1),
            completion_ids.size(1),
            clamp_fraction=self.clamp_fraction(),
            aux_loss=self.aux_loss_enabled,
            multimodal=inputs,  # a VLM's image inputs among them
        )
        return ScoredCompletions(log_probs, entropy, clamped_entropy, router_loss)

    def completion_batch(self, inputs, scored: ScoredCompletions) -> CompletionBatch:
        """Step 2: what every hook sees, complete before any runs: the scores, the tokens that count, the generation
        batch's advantages, rollout entropy and carried tensors, and the tokens TRL's high-entropy filter keeps."""
        completion_mask = inputs["completion_mask"]
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        old_log_probs, group_advantages = inputs.get("old_per_token_logps"), inputs["advantages"]
        batch = CompletionBatch(
            log_probs=scored.log_probs,
            old_log_probs=scored.log_probs.detach() if old_log_probs is None else old_log_probs,
            entropy=scored.entropy,
            clamped_entropy=scored.clamped_entropy,
            mask=mask,
            group_advantages=group_advantages.unsqueeze(1) if group_advantages.dim() == 1 else group_advantages,
            mode=self.mode,
            importance_sampling_ratio=inputs.get("importance_sampling_ratio"),
            old_entropy=self.rollout_entropy(inputs, scored.entropy),
            carried={key: inputs[key] for key in self.carried_token_keys if key in inputs},
        )
        if self.top_entropy_quantile < 1.0:
            batch.entropy_mask = self.get_high_entropy_mask(scored.entropy, mask, 1 - self.top_entropy_quantile)
        return batch

    def apply_token_gates(self, batch: CompletionBatch, per_token_loss: torch.Tensor, inputs) -> torch.Tensor:
        """Step 6: TRL's gates on the per-token loss: its off-policy mask (sequences with a negative group advantage
        that drifted too far from the sampler), its high-entropy filter, and its vLLM importance-sampling weight."""
        if self.off_policy_mask_threshold is not None:
            per_token_loss = per_token_loss * self.get_off_policy_mask(
                advantages=batch.group_advantages,
                per_token_logps=batch.log_probs,
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", batch.old_log_probs),
                mask=batch.mask,
                off_policy_threshold=self.off_policy_mask_threshold,
            )
        if batch.entropy_mask is not None:
            per_token_loss = per_token_loss * batch.entropy_mask
        if self.use_vllm and self.vllm_importance_sampling_correction and self.loss_type != "vespo":
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]  # VESPO folds it into its weight
        return per_token_loss

    def reference_kl(self, batch: CompletionBatch, ratio: torch.Tensor, inputs) -> torch.Tensor | None:
        """Step 7: the per-token k3 KL to the reference model (times the ratio with ``use_bias_correction_kl``), or
        None when ``beta`` is 0."""
        if self.beta == 0.0:
            return None
        per_token_kl = k3_kl(batch.log_probs, inputs["ref_per_token_logps"])
        if self.args.use_bias_correction_kl:
            per_token_kl = per_token_kl * ratio
        return per_token_kl

    def accumulation_steps(self, mode: str) -> float:
        """What a micro-batch's loss terms are divided by: the accumulation steps in training, 1 in evaluation."""
        return self.current_gradient_accumulation_steps if mode == "train" else 1.0

    def aggregate(self, batch: CompletionBatch, per_token_loss: torch.Tensor, inputs):
        """Step 8: ``(policy_loss, loss)``, the loss reduced per ``loss_type``, then divided for accumulation."""
        accumulation = self.accumulation_steps(batch.mode)
        dapo_normaliser = None
        if self.loss_type in TOKEN_SUM_LOSS_TYPES:  # every token of the generation batch (all ranks), per window
            dapo_normaliser = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if batch.mode == "train":
                dapo_normaliser = dapo_normaliser * accumulation / self.args.steps_per_generation
        policy_loss, scale = aggregate_loss(
            per_token_loss, batch.mask, self.loss_type, self.max_completion_length, dapo_normaliser
        )
        return policy_loss, policy_loss / (accumulation if scale else 1.0)

    def add_regularisers(self, batch, loss, policy_loss, router_loss) -> torch.Tensor:
        """Step 9: TRL's entropy bonus, the method's ``regulariser`` and the MoE load-balancing loss, each a token mean
        of the micro-batch divided by the accumulation steps, as TRL scales its own."""
        accumulation = self.accumulation_steps(batch.mode)
        if self.entropy_bonus_enabled:
            bonus = self.trl_entropy_bonus(batch.entropy, self.entropy_bonus_mask(batch), policy_loss, batch.mode)
            loss = loss - bonus / accumulation
        regulariser = self.regulariser(batch)
        if regulariser is not None:
            loss = loss + regulariser / accumulation
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * router_loss / accumulation
            router_loss_mean = self.accelerator.gather_for_metrics(router_loss.detach()).mean().item()
            self.record_metric(batch.mode, "aux_loss", router_loss_mean)
        return loss

    @staticmethod
    def entropy_bonus_mask(batch: CompletionBatch) -> torch.Tensor:
        """The tokens TRL's entropy bonus averages over: the valid ones its high-entropy filter keeps."""
        return batch.mask if batch.entropy_mask is None else batch.mask * batch.entropy_mask

    def update_controllers(self, batch: CompletionBatch) -> None:
        """Step 10, where coefficients move (training only): the cycle's controllers at the optimizer step that ends a
        cycle (one with ``statistic=None`` moves in its method's hook), TRL's adaptive coefficient at every step."""
        if batch.mode != "train":
            return
        if self.entropy_bonus_enabled:
            self.step_trl_entropy_coef(batch.entropy, self.entropy_bonus_mask(batch))
        if self.controllers:
            self.controller_cycle.add(batch)
            if self.accelerator.sync_gradients:
                for name, value in self.controller_cycle.end_optimizer_step(self.state.global_step + 1).items():
                    self.record_metric("train", name, value)

    def record_loss_step_metrics(self, batch, token_advantages, ratio, per_token_kl) -> None:
        """Step 11: the metrics TRL logs for a loss step (entropy, clip fractions, KL) and the covariance of
        log-prob and token advantage."""
        metrics = loss_step_metrics(
            self.accelerator, batch, token_advantages, ratio, per_token_kl, self.clip_range(), self.loss_type
        )
        for name, value in metrics.items():
            self.record_metric(batch.mode, name, value)

    # ------------------------------------------------------------------------------------------------------------
    # Overrides of transformers.Trainer
    # ------------------------------------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint=None, *positional, **keyword):
        if resume_from_checkpoint is True:  # the latest complete checkpoint: interrupted saves are skipped
            resume_from_checkpoint = last_complete_checkpoint(self.args.output_dir)
        with tied_weights_not_reported_missing(self):
            return super().train(resume_from_checkpoint, *positional, **keyword)
