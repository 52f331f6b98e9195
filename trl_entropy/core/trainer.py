"""``EntropyGRPOTrainer``: GRPO's loss step, owned here, with the methods of its config as parts. It stands on
``core/trl/bridge.py``'s ``TRLBridge``, the one place that touches the private methods and attributes of
``trl.GRPOTrainer`` and ``transformers.Trainer``; this module uses only the names the bridge offers.

A method is data here: its config names its parts (``method_parts``, ``core/parts.py``), one per method, in the order
of the axes they act on; ``loss_step`` runs its steps in order and asks every part for the seam of each step. With no
part it computes exactly ``trl.GRPOTrainer``'s loss, TRL's own entropy bonus (``entropy_coef``,
``use_adaptive_entropy``) and a Mixture-of-Experts model's router load-balancing loss included.

The advantages go by two names: ``batch.group_advantages`` (one per completion, its reward against its group's
baseline, made once per generation batch; TRL's off-policy gate reads them) and ``token_advantages`` (what step 3 makes
of them, per sequence or per token; the surrogate multiplies exactly these). Controller state and the progress of the
current generation cycle travel in every checkpoint (``trainer_state.json``), pushed ones included, and are restored by
``resume_from_checkpoint``, also in the middle of a cycle.
"""

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from accelerate.utils import is_peft_model

from .batch import OLD_ENTROPY_KEY, CompletionBatch
from .checkpoint import (
    end_checkpoint,
    last_complete_checkpoint,
    restore_entropy_control,
    save_entropy_control,
    tied_weights_not_reported_missing,
)
from .citation import sign_combined_model_card
from .config import EntropyGRPOBaseConfig
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
from .parts import MethodPart, TokenGate, TopPRule
from .places import PLACES, Place, fold
from .schedules import ENTROPY_COEF_SCHEDULE
from .statistics import Gathered, TokenMean, global_token_mean, reduce_metrics
from .trl.advantages import advantages_around_baseline, summed_rewards
from .trl.bridge import TRLBridge
from .trl.metrics import loss_step_metrics
from .trl.objectives import TOKEN_SUM_LOSS_TYPES, aggregate_loss, k3_kl
from .trl.surrogates import importance_ratio, policy_surrogate, vespo_weights


@dataclass
class LossStep:
    """What ``loss_step`` gives for one micro-batch: its ``loss``, the ``batch`` its steps saw, and its ``metrics``
    ``(name, value)`` in the order the steps measured them, not yet reduced over the ranks."""

    loss: torch.Tensor
    batch: CompletionBatch
    metrics: list[tuple[str, object]]


def generation_batch_mask(inputs: dict) -> torch.Tensor:
    """The completion tokens that count: the completion mask times TRL's tool mask."""
    completion_mask = inputs["completion_mask"]
    return completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]


class EntropyGRPOTrainer(TRLBridge):
    """`trl.GRPOTrainer` whose loss step is owned here, and whose methods are its config's parts (see the module
    docstring).

    Takes the same arguments as `trl.GRPOTrainer`; `args` is `trl_entropy.EntropyGRPOConfig` (the methods its
    `entropy_control` names), a method's own config, or a plain `GRPOConfig` (converted: no method)."""

    config_class: ClassVar[type] = EntropyGRPOBaseConfig
    # A method's trainer names its paper (``core.citation.Paper``) and, from it, its model card's ``_name``, ``_paper``
    # and ``_tag_names``, as TRL's trainers do; the base is GRPO's.
    paper: ClassVar = None

    def __init__(self, model, reward_funcs=None, args=None, *positional, **keyword):
        args = self.config_class.coerce(args, type(self).__name__, model)
        if type(self) is not EntropyGRPOTrainer and args.method_parts != self.config_class.method_parts:
            raise TypeError(
                f"{type(self).__name__} cannot train entropy_control={args.entropy_control!r}: it trains "
                f"{self.config_class.__name__}'s methods. Pass the config to EntropyGRPOTrainer, which trains the "
                "methods its config names."
            )
        # Before TRL's set-up, which fails obscurely on a model the head cannot score (a bare backbone).
        if isinstance(model, str):  # model_init_kwargs' trust_remote_code wins over the config's, as in TRL
            trust_remote_code = (args.model_init_kwargs or {}).get("trust_remote_code", args.trust_remote_code)
            reason = unsupported_head_reason_at(model, trust_remote_code)
        else:
            reason = unsupported_head_reason(model)
        if reason is not None:
            raise ValueError(reason)
        if args.model_card is not None:  # methods combined: this trainer's card names them all
            sign_combined_model_card(self, args.model_card)
        super().__init__(model, reward_funcs, args, *positional, **keyword)
        self.parts: list[MethodPart] = []
        for part in args.method_parts:  # a loop, not a comprehension: a part's warning points at the caller's line
            self.parts.append(part(self))
        if self.environment_factories is None:  # an environment supplies the prompts itself (TRL)
            check_prompt_columns(self.train_dataset, self.eval_dataset)
        check_image_columns(self.train_dataset, self.eval_dataset, self.model, self.processing_class)
        policy = self.model.get_base_model() if is_peft_model(self.model) else self.model
        install_entropy_head(policy, self.temperature, args.cast_lm_head_to_fp32)
        if self.ref_model is not None:
            install_entropy_head(self.ref_model, self.temperature, args.cast_lm_head_to_fp32)
        self.controller_cycle = ControllerCycle(
            [controller for part in self.parts for controller in part.controllers()],
            micro_batches_per_cycle=args.steps_per_generation * self.num_iterations,
            accumulation_steps=args.gradient_accumulation_steps,
            reduce_sum=lambda sums: self.accelerator.reduce(sums, reduction="sum"),
        )
        self.controllers: dict[str, Controller] = self.controller_cycle.controllers
        self._entropy_control_state = EntropyControlState()  # carries the controller state into every checkpoint
        self.add_callback(self._entropy_control_state)

    def part(self, key: str) -> MethodPart:
        """The part of the method ``key`` (its registry key)."""
        return next(part for part in self.parts if part.key == key)

    @property
    def needs_rollout_entropy(self) -> bool:
        return any(part.needs_rollout_entropy for part in self.parts)

    def record_metrics(self, mode: str, metrics: list[tuple[str, object]]) -> None:
        """Record metrics ``(name, value)``, reduced over the ranks first (collective: ``reduce_metrics``)."""
        for name, value in reduce_metrics(self.accelerator, metrics):
            self.record_metric(mode, name, value)

    def at(self, place: Place, start, ask, metrics: list | None = None, apply=None):
        """The value ``place`` gives: ``start`` and each part's answer, ``ask(part, value so far)``, combined by the
        place's rule (``core/places.py``); the seams' own metrics are added to ``metrics``."""
        reports_metrics = PLACES[place].reports_metrics

        def asker(part):
            def answer(value):
                if not reports_metrics:
                    return ask(part, value)
                result, measured = ask(part, value)
                metrics.extend(measured.items())
                return result

            return answer

        return fold(PLACES[place].rule, [asker(part) for part in self.parts], start, apply)

    def before_checkpoint_save(self, folder: str) -> None:
        """The controllers' state, the cycle's progress and each part's per-rank state go into the checkpoint; the
        folder is marked as being written (``core/checkpoint.py``)."""
        save_entropy_control(self, folder)

    def after_checkpoint_save(self, folder: str) -> None:
        """The folder marked complete, once every rank has written its part."""
        end_checkpoint(self, folder)

    def after_checkpoint_load(self, checkpoint: str) -> None:
        """The entropy-control state of ``checkpoint`` taken over (``core/checkpoint.py``)."""
        restore_entropy_control(self, checkpoint)

    def rank_checkpoint_state(self) -> dict[str, object]:
        """This rank's extra checkpoint state: every part's."""
        return {pattern: value for part in self.parts for pattern, value in part.rank_checkpoint_state().items()}

    def restore_rank_checkpoint_state(self, checkpoint: str) -> None:
        for part in self.parts:
            part.restore_rank_checkpoint_state(checkpoint)

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
        """TRL's advantages around the method's group baseline (where a part gives one), then every part's
        ``on_generation_batch``."""
        num_generations = self.num_generations if self.mode == "train" else self.num_generations_eval
        rewards = summed_rewards(self._gathered_rewards, self.reward_weights)
        metrics = []  # every rank has the same gathered rewards: the same group baselines
        grouped = rewards.view(-1, num_generations)
        baseline = self.at(Place.GROUP_BASELINE, None, lambda part, _: part.group_baseline(grouped), metrics)
        if baseline is not None:  # this rank's rows of TRL's advantages around it, as TRL slices them
            if self.multi_objective_aggregation != "sum_then_normalize":
                baselines = ", ".join(self.parts_at(Place.GROUP_BASELINE))
                raise ValueError(f"{baselines} needs multi_objective_aggregation='sum_then_normalize'.")
            group_advantages = advantages_around_baseline(rewards, num_generations, self.scale_rewards, baseline)
            output["advantages"] = group_advantages[self.accelerator.process_index * rows :][:rows]
            self.replace_logged_advantages(group_advantages.tolist())  # the completions table shows them too
        own_rewards = rewards[self.accelerator.process_index * rows :][:rows]
        advantages = self.at(
            Place.ROLLOUT_REJECTION,
            output["advantages"],
            lambda part, advantages: part.reject_rollouts(own_rewards, advantages, output),
            metrics,
        )
        if advantages is not output["advantages"]:
            output["advantages"] = advantages
            self.replace_logged_advantages(self.accelerator.gather(advantages).tolist())
        self.record_metrics(self.mode, metrics)
        for part in self.parts:
            part.on_generation_batch(output)
        return output

    def parts_at(self, place: Place) -> list[str]:
        """The keys of the parts that act at ``place``."""
        seam = PLACES[place].seam
        return [part.key for part in self.parts if getattr(type(part), seam) is not getattr(MethodPart, seam)]

    def generation_batch_entropy(self, output: dict) -> float:
        """The rollout policy's mean entropy over the valid tokens of every rank's generation batch ``output``: the one
        kept from TRL's rollout pass where TRL makes that pass, else one scoring pass without gradient (on-policy the
        weights are the rollout policy's). Every rank must call it."""
        entropy = output.get(OLD_ENTROPY_KEY)
        if entropy is None:
            entropy = self.score_generation_batch(output).entropy
        return global_token_mean(self.accelerator, entropy, generation_batch_mask(output))

    def score_generation_batch(self, output: dict, top_p_rule: TopPRule | None = None) -> ScoredCompletions:
        """One scoring pass without gradient over this rank's generation batch ``output``, in micro-batches of the
        mode's per-device size, as TRL scores its rollout log-probs."""
        completion_ids, completion_mask = output["completion_ids"], output["completion_mask"]
        args = self.args
        batch_size = args.per_device_train_batch_size if self.mode == "train" else args.per_device_eval_batch_size
        with torch.no_grad():
            return self.score_tokens(
                self.model,
                torch.cat([output["prompt_ids"], completion_ids], dim=1),
                torch.cat([output["prompt_mask"], completion_mask], dim=1),
                completion_ids.size(1),
                batch_size=batch_size,
                multimodal=output,
                top_p_rule=top_p_rule,
            )

    def generation_cycle(self) -> tuple[int, int]:
        """``(k, K)``: the 0-based index of the current generation cycle (counted from the optimizer step, so a resumed
        run counts on) and the run's number of cycles, ``ceil(max_steps · accumulation / micro-batches per cycle)``."""
        per_cycle = self.args.steps_per_generation * self.num_iterations
        accumulation = self.args.gradient_accumulation_steps
        micro_batches = self.state.global_step * accumulation + self.micro_step % accumulation
        return micro_batches // per_cycle, math.ceil(self.state.max_steps * accumulation / per_cycle)

    def score_tokens(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        clamp_fraction=0.0,
        aux_loss=False,
        multimodal=None,
        top_p_rule: TopPRule | None = None,
    ) -> ScoredCompletions:
        """Per-token log-probs, entropies, clamped entropies (when ``clamp_fraction > 0``), the MoE router loss (when
        ``aux_loss``) of the last ``logits_to_keep`` positions, from the entropy head; a VLM's ``multimodal`` too."""
        request = EntropyHeadRequest(
            logits_to_keep=logits_to_keep,
            clamp_fraction=clamp_fraction,
            chunk_size=self.args.entropy_kernel_chunk_size,
            backend=self.args.entropy_kernel_backend,
            compute_aux_loss=aux_loss,
            top_p=None if top_p_rule is None else top_p_rule.p,
            top_k=None if top_p_rule is None else top_p_rule.k,
            include_crossing=top_p_rule is not None and top_p_rule.include_crossing,
        )
        return score_completions(
            model, input_ids, attention_mask, request, batch_size, self.accelerator.autocast, multimodal
        )

    def loss_step(self, model, inputs) -> LossStep:
        """GRPO's loss of one micro-batch, in the order its steps run; each step that a method can change asks the
        parts at its place and combines their answers by the place's rule (``core/places.py``). The group baseline
        and the rollout rejection act before, once per generation batch (``finish_generation_batch``), and give
        ``batch.group_advantages``. The step moves no controller and reduces no metric: ``after_loss_step`` does."""
        metrics: list[tuple[str, object]] = []
        scored = self.score_micro_batch(model, inputs)  # 1. score
        batch = self.completion_batch(inputs, scored)  # 2. batch
        token_advantages = self.token_advantages(batch, metrics)  # 3. token advantages
        ratio = self.ratio(batch)  # 4. importance ratio
        clip_range = self.clip_range()  # 5. clip range
        per_token_loss = self.surrogate(batch, ratio, token_advantages, clip_range, metrics)  # 6. surrogate
        per_token_loss = self.add_penalties(batch, ratio, token_advantages, per_token_loss, metrics)  # 7. penalties
        per_token_loss = self.apply_gates(batch, ratio, token_advantages, per_token_loss, inputs, metrics)  # 8. gates
        per_token_kl = self.reference_kl(batch, ratio, inputs)  # 9. reference KL
        if per_token_kl is not None:
            per_token_loss = per_token_loss + self.beta * per_token_kl
        policy_loss, loss = self.aggregate(batch, per_token_loss, inputs)  # 10. aggregation
        loss = self.add_regularisers(batch, loss, policy_loss, scored.router_loss, metrics)  # 11. regularisers
        metrics += self.trl_metrics(batch, token_advantages, ratio, per_token_kl, clip_range)  # 12. TRL's metrics
        return LossStep(loss, batch, metrics)

    def trl_metrics(self, batch, token_advantages, ratio, per_token_kl, clip_range) -> list[tuple[str, object]]:
        """The metrics TRL logs for a loss step (entropy, clip fractions, KL) and the covariance of log-prob and token
        advantage, to be reduced over the ranks."""
        return loss_step_metrics(batch, token_advantages, ratio, per_token_kl, clip_range, self.loss_type)

    def after_loss_step(self, step: LossStep) -> None:
        """After each micro-batch's loss step: its metrics reduced over the ranks and recorded; in training, the
        controllers moved (those of cadence ``"micro_batch"`` on this micro-batch, the others at the optimizer step
        that ends a cycle), TRL's adaptive coefficient stepped and the scheduled coefficient set."""
        batch = step.batch
        self.record_metrics(batch.mode, step.metrics)
        if batch.mode != "train":
            return
        global_step = self.state.global_step + 1
        self.controller_cycle.update_micro_batch(batch.world_means, global_step)
        for controller in self.controllers.values():
            controller.follow_schedule(self)
        if self.entropy_bonus_enabled:
            if self.args.entropy_schedule().moves:
                self.entropy_coef, progress = ENTROPY_COEF_SCHEDULE.now(self)  # TRL's coefficient, which TRL logs
                if self.accelerator.sync_gradients:
                    self.record_metric("train", "entropy/schedule_progress", progress)
            self.step_trl_entropy_coef(batch.entropy, self.entropy_bonus_mask(batch))
        if self.controllers:
            self.controller_cycle.add(batch)
            if self.accelerator.sync_gradients:
                for name, value in self.controller_cycle.end_optimizer_step(global_step).items():
                    self.record_metric("train", name, value)

    def score_micro_batch(self, model, inputs) -> ScoredCompletions:
        """The completion tokens' log-probs, entropies, clamped entropies (the parts' largest ``clamp_fraction``) and
        the MoE router loss, from the entropy head (a vision-language model's images passed on as TRL passes
        them)."""
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        return self.score_tokens(
            model,
            torch.cat([inputs["prompt_ids"], completion_ids], dim=1),
            torch.cat([inputs["prompt_mask"], completion_mask], dim=1),
            completion_ids.size(1),
            clamp_fraction=self.clamp_fraction(),
            aux_loss=self.aux_loss_enabled,
            multimodal=inputs,  # a VLM's image inputs among them
            top_p_rule=self.top_p_rule(),
        )

    def clamp_fraction(self) -> float:
        """The fraction of the vocabulary the clamped entropy drops: the largest a part asks for (0: none)."""
        return self.at(Place.CLAMP_FRACTION, 0.0, lambda part, _: part.clamp_fraction())

    def top_p_rule(self) -> TopPRule | None:
        """The top-p set a part asks the kernel for."""
        return self.at(Place.TOP_P, None, lambda part, _: part.top_p_rule())

    def completion_batch(self, inputs, scored: ScoredCompletions) -> CompletionBatch:
        """What every seam sees, complete before any runs: the scores, the tokens that count, the generation batch's
        group advantages, rollout entropy and carried tensors, the tokens TRL's high-entropy filter keeps, and in
        training the world means that controllers of cadence ``"micro_batch"`` move on (collective, where there is
        one)."""
        mask = generation_batch_mask(inputs)
        old_log_probs, group_advantages = inputs.get("old_per_token_logps"), inputs["advantages"]
        carried = {key for part in self.parts for key in part.carried_token_keys}
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
            top_p_entropy=scored.top_p_entropy,
            top_p_set_size=scored.top_p_set_size,
            carried={key: inputs[key] for key in sorted(carried) if key in inputs},
        )
        if self.top_entropy_quantile < 1.0:
            batch.entropy_mask = self.get_high_entropy_mask(scored.entropy, mask, 1 - self.top_entropy_quantile)
        if batch.mode == "train":
            batch.world_means = self.controller_cycle.micro_batch_means(batch)
        return batch

    def token_advantages(self, batch: CompletionBatch, metrics: list) -> torch.Tensor:
        """The advantages the surrogate multiplies: a part's, or the group advantages, ``(B, 1)`` or ``(B, T)``."""
        return self.at(Place.ADVANTAGES, batch.group_advantages, lambda part, _: part.token_advantages(batch), metrics)

    def ratio(self, batch: CompletionBatch) -> torch.Tensor:
        """``r = exp(ℓ − ℓ^old)`` per token, or per sequence with ``importance_sampling_level="sequence"``."""
        return importance_ratio(batch.log_probs, batch.old_log_probs, batch.mask, self.importance_sampling_level)

    def clip_range(self) -> tuple[float, float]:
        """``(ε_low, ε_high)`` of the PPO clip: a part's, or the config's."""
        return self.at(Place.CLIP_RANGE, (self.epsilon_low, self.epsilon_high), lambda part, _: part.clip_range())

    def surrogate(self, batch, ratio, token_advantages, clip_range, metrics: list) -> torch.Tensor:
        """The per-token policy loss: a part's, or the loss type's."""
        per_token_loss = self.at(
            Place.SURROGATE, None, lambda part, _: part.surrogate(batch, ratio, token_advantages), metrics
        )
        if per_token_loss is not None:
            return per_token_loss
        return self.loss_type_surrogate(batch, ratio, token_advantages, clip_range, metrics)

    def loss_type_surrogate(self, batch, ratio, token_advantages, clip_range, metrics: list) -> torch.Tensor:
        """Per-token surrogate of ``loss_type`` (``core/trl/surrogates.py``):
        ``−min(r·A, clip(r, 1−ε_low, 1+ε_high)·A)`` with TRL's two-sided ``delta`` clip for the clipped losses;
        CISPO's, SAPO's or VESPO's otherwise."""
        phi = None
        if self.loss_type == "vespo":
            ratios = batch.importance_sampling_ratio
            phi = vespo_weights(batch.log_probs, batch.old_log_probs, token_advantages, batch.mask, ratios, self.args)
            metrics.append(("vespo/phi_seq_mean", TokenMean(phi, batch.mask)))
        return policy_surrogate(self.loss_type, batch.log_probs, ratio, token_advantages, clip_range, self.args, phi)

    def add_penalties(self, batch, ratio, token_advantages, per_token_loss, metrics: list) -> torch.Tensor:
        """The parts' per-token penalties (KL-Cov's), added to the surrogate before the gates act."""
        return self.at(Place.KL, per_token_loss, lambda part, _: part.penalty(batch, ratio, token_advantages), metrics)

    def apply_gates(self, batch, ratio, token_advantages, per_token_loss, inputs, metrics: list) -> torch.Tensor:
        """The parts' gates in axis order, then TRL's: its off-policy mask (sequences with a negative group advantage
        that drifted too far from the sampler), its high-entropy filter, and its vLLM importance-sampling weight."""
        per_token_loss = self.at(
            Place.GATES,
            per_token_loss,
            lambda part, _: part.gate(batch, ratio, token_advantages),
            metrics,
            apply=TokenGate.apply,
        )
        gates = []
        if self.off_policy_mask_threshold is not None:
            off_policy_mask = self.get_off_policy_mask(
                advantages=batch.group_advantages,
                per_token_logps=batch.log_probs,
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", batch.old_log_probs),
                mask=batch.mask,
                off_policy_threshold=self.off_policy_mask_threshold,
            )
            gates.append(TokenGate(weight=off_policy_mask))
        if batch.entropy_mask is not None:
            gates.append(TokenGate(weight=batch.entropy_mask))
        if self.use_vllm and self.vllm_importance_sampling_correction and self.loss_type != "vespo":
            gates.append(TokenGate(weight=inputs["importance_sampling_ratio"]))  # VESPO folds it into its weight
        for gate in gates:
            per_token_loss = gate.apply(per_token_loss)
        return per_token_loss

    def reference_kl(self, batch: CompletionBatch, ratio: torch.Tensor, inputs) -> torch.Tensor | None:
        """The per-token k3 KL to the reference model (times the ratio with ``use_bias_correction_kl``), or None when
        ``beta`` is 0."""
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
        """``(policy_loss, loss)``, the loss reduced per ``loss_type``, then divided for accumulation."""
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

    def add_regularisers(self, batch, loss, policy_loss, router_loss, metrics: list) -> torch.Tensor:
        """TRL's entropy bonus, the parts' regularisers and the MoE load-balancing loss, each a token mean of the
        micro-batch divided by the accumulation steps, as TRL scales its own."""
        accumulation = self.accumulation_steps(batch.mode)
        if self.entropy_bonus_enabled:
            coefficient = self.scheduled_entropy_coef()
            mask = self.entropy_bonus_mask(batch)
            loss = loss - self.trl_entropy_bonus(batch.entropy, mask, coefficient) / accumulation
            metrics.append(("policy_loss", Gathered(policy_loss.detach(), lambda losses: losses.nanmean().item())))
        loss = self.at(
            Place.REGULARISER,
            loss,
            lambda part, _: part.regulariser(batch),
            metrics,
            apply=lambda regulariser, loss: loss + regulariser / accumulation,
        )
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * router_loss / accumulation
            metrics.append(
                ("aux_loss", Gathered(router_loss.detach(), lambda losses: losses.mean().item(), for_metrics=True))
            )
        return loss

    def scheduled_entropy_coef(self) -> float | None:
        """The entropy coefficient of ``entropy_coef_schedule`` at the current step (None: no schedule moves it)."""
        if not self.args.entropy_schedule().moves:
            return None
        coefficient, _ = ENTROPY_COEF_SCHEDULE.now(self)
        return coefficient

    @staticmethod
    def entropy_bonus_mask(batch: CompletionBatch) -> torch.Tensor:
        """The tokens TRL's entropy bonus averages over: the valid ones its high-entropy filter keeps."""
        return batch.mask if batch.entropy_mask is None else batch.mask * batch.entropy_mask

    # ------------------------------------------------------------------------------------------------------------
    # Overrides of transformers.Trainer
    # ------------------------------------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint=None, *positional, **keyword):
        if resume_from_checkpoint is True:  # the latest complete checkpoint: interrupted saves are skipped
            resume_from_checkpoint = last_complete_checkpoint(self.args.output_dir)
        with tied_weights_not_reported_missing(self):
            return super().train(resume_from_checkpoint, *positional, **keyword)
