"""The shared base: ``EntropyGRPOConfig`` and ``EntropyGRPOTrainer``.

The base owns GRPO's loss step and exposes the hooks every entropy-control method fills:

* ``per_token_advantages(batch)``   the advantages the surrogate uses, ``(B, 1)`` or ``(B, T)``;
* ``clip_range()``                  ``(ε_low, ε_high)`` of the PPO clip;
* ``per_token_policy_loss(batch, ratio, advantages)``  the per-token surrogate;
* ``regulariser(batch)``            a scalar added to the loss (a token mean; the base scales it for accumulation);
* ``build_controllers()``           the controllers moved once per generation cycle.

It also owns what every controller needs: its statistic summed over the generation cycle and all ranks, the update at
the optimizer step that ends the cycle, the controller values in the metrics, and the controller state in every
checkpoint, pushed ones included (restored by ``resume_from_checkpoint``, also in the middle of a cycle). With no hook
overridden it computes exactly ``trl.GRPOTrainer``'s loss, TRL's own entropy bonus (``entropy_coef``,
``use_adaptive_entropy``) and a Mixture-of-Experts model's router load-balancing loss included.
"""

import math
import os
import warnings
from dataclasses import dataclass, field, fields
from typing import ClassVar

import torch
import transformers
from accelerate.utils import is_peft_model, send_to_device
from transformers import AutoConfig, AutoModelForCausalLM, ProcessorMixin
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import logging
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import nanmax, nanmin

from .controllers import Controller, EntropyControlState
from .diagnostics import covariance_from_moments, covariance_moments, masked_mean
from .head import EntropyHeadRequest, install_entropy_head, unsupported_head_reason
from .validation import warn_if_on_policy


# The buffered generation batch of a checkpoint taken inside a generation cycle, one file per process.
GENERATION_BATCH_FILE = "trl_entropy_generation_batch_{process_index}.pt"
logger = logging.get_logger(__name__)

KERNEL_BACKENDS = ("auto", "torch", "triton")


@dataclass
class EntropyGRPOConfig(GRPOConfig):
    r"""
    Configuration for [`EntropyGRPOTrainer`]: every field of [`~trl.GRPOConfig`] plus the entropy kernel's settings.

    With no entropy control switched on, the trainer computes exactly `trl.GRPOTrainer`'s loss. The methods'
    configs (`AEntConfig`, `ClipCovConfig`, ...) subclass this one.

    Parameters:
        entropy_kernel_chunk_size (`int` or `None`, *optional*, defaults to `None`):
            Tokens per chunk of the fused log-prob/entropy kernel. `None` lets the kernel choose from the vocabulary
            size.
        entropy_kernel_backend (`str`, *optional*, defaults to `"auto"`):
            `"auto"` (Triton on CUDA, PyTorch elsewhere), `"torch"` or `"triton"`.
    """

    supported_loss_types: ClassVar[tuple[str, ...]] = ("grpo", "bnpo", "dr_grpo", "dapo")
    # True where the method moves the clip range itself (and warns about on-policy training in its own words).
    controls_clip_range: ClassVar[bool] = False

    entropy_kernel_chunk_size: int | None = field(
        default=None,
        metadata={
            "help": "Tokens per chunk of the fused log-prob/entropy kernel. None lets the kernel choose from the "
            "vocabulary size; smaller values lower the peak memory."
        },
    )
    entropy_kernel_backend: str = field(
        default="auto",
        metadata={
            "help": "Backend of the fused log-prob/entropy kernel: 'auto' (Triton on CUDA, PyTorch elsewhere), "
            "'torch' or 'triton'.",
            "choices": list(KERNEL_BACKENDS),
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.loss_type not in self.supported_loss_types:
            raise ValueError(
                f"loss_type={self.loss_type!r} is not supported by {type(self).__name__}; "
                f"choose one of {list(self.supported_loss_types)}."
            )
        if self.entropy_kernel_backend not in KERNEL_BACKENDS:
            raise ValueError(
                f"entropy_kernel_backend={self.entropy_kernel_backend!r} is not one of {list(KERNEL_BACKENDS)}."
            )
        chunk_size = self.entropy_kernel_chunk_size
        if chunk_size is not None and (
            isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0
        ):
            raise ValueError(f"entropy_kernel_chunk_size must be a positive integer or None, got {chunk_size!r}.")
        epsilon_high = self.epsilon if self.epsilon_high is None else self.epsilon_high  # None means epsilon
        if (self.epsilon, epsilon_high) != (0.2, 0.2) and not self.controls_clip_range:
            # The clip-low recipe (Park et al., arXiv:2509.26114) acts through the clip, which on-policy never binds.
            warn_if_on_policy(
                self,
                f"epsilon={self.epsilon}, epsilon_high={epsilon_high}",
                "every ratio is 1, so the clip never binds and the clip range has no effect.",
                "it to act",
                stacklevel=3,
            )

    @classmethod
    def from_grpo_config(cls, grpo_config: GRPOConfig):
        """This config built from a plain `GRPOConfig`: every field the user changed from `GRPOConfig`'s defaults keeps
        its value; every other field, the method's own included, takes this config's default."""
        # A GRPOConfig's fields hold values derived in __post_init__ (steps_per_generation, bf16, scale_rewards...). A
        # GRPOConfig built from the defaults derives the same values, so comparing with one finds what was changed.
        # The precision and device are carried over as they are: the defaults may not even be valid on this machine.
        kept = {name: getattr(grpo_config, name) for name in ("output_dir", "use_cpu", "bf16", "fp16")}
        reference = GRPOConfig(**kept)
        changed = {
            f.name: getattr(grpo_config, f.name)
            for f in fields(GRPOConfig)
            # generation_batch_size follows from steps_per_generation; passing both is an error in GRPOConfig.
            if f.init
            and f.name != "generation_batch_size"
            and getattr(grpo_config, f.name) != getattr(reference, f.name)
        }
        return cls(**kept, **changed)


def weightless_model(name_or_path: str, args: GRPOConfig):
    """The model TRL would load for ``name_or_path`` (the class its config names), built on the meta device: the
    same checks as an instance, without loading weights."""
    init_kwargs = args.model_init_kwargs or {}
    config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=init_kwargs.get("trust_remote_code", False))
    architecture = getattr(transformers, (config.architectures or [""])[0], None) or AutoModelForCausalLM
    with torch.device("meta"):
        return architecture.from_config(config) if architecture is AutoModelForCausalLM else architecture(config)


@dataclass
class CompletionBatch:
    """Everything the hooks see about one micro-batch of completions. Per-token tensors are ``(B, T)``."""

    log_probs: torch.Tensor  # ℓ_t, differentiable
    old_log_probs: torch.Tensor  # ℓ^old_t (rollout policy), detached
    entropy: torch.Tensor  # H_t, full entropy, differentiable
    clamped_entropy: torch.Tensor | None  # H^c_t when the method asks for it, differentiable
    mask: torch.Tensor  # m_t: completion mask times TRL's tool mask
    advantages: torch.Tensor  # A_t as TRL computed it, (B, 1)
    entropy_mask: torch.Tensor | None = None  # tokens TRL's high-entropy filter keeps (top_entropy_quantile < 1)


class EntropyGRPOTrainer(GRPOTrainer):
    """`trl.GRPOTrainer` whose loss step is owned here and opened up through small hooks (see the module docstring).

    Takes the same arguments as `trl.GRPOTrainer`; `args` must be an `EntropyGRPOConfig` (or the method's config).
    """

    config_class: ClassVar[type] = EntropyGRPOConfig
    _tag_names = ["trl", "grpo", "trl-entropy"]

    def __init__(self, model, reward_funcs=None, args=None, *positional, **keyword):
        if args is None:
            raise ValueError(f"{type(self).__name__} needs `args`, an instance of {self.config_class.__name__}.")
        if isinstance(args, GRPOConfig) and not isinstance(args, EntropyGRPOConfig):
            args = self.config_class.from_grpo_config(args)
            logger.warning(
                f"{type(self).__name__}: built a {self.config_class.__name__} from the GRPOConfig given as `args`; "
                f"fields left at GRPOConfig's defaults, and {self.config_class.__name__}'s own fields, take "
                f"{self.config_class.__name__}'s defaults."
            )
        if not isinstance(args, self.config_class):
            raise TypeError(
                f"{type(self).__name__} needs `args` of type {self.config_class.__name__} (or a plain GRPOConfig), "
                f"got {type(args).__name__}."
            )
        # Before TRL's set-up, which fails obscurely on a model the head cannot score (a bare backbone).
        reason = unsupported_head_reason(model if not isinstance(model, str) else weightless_model(model, args))
        if reason is not None:
            raise ValueError(reason)
        super().__init__(model, reward_funcs, args, *positional, **keyword)
        if isinstance(self.processing_class, ProcessorMixin):
            raise NotImplementedError(
                f"{type(self).__name__} trains text-only causal LMs; vision-language processors "
                f"({type(self.processing_class).__name__}) are not supported by the entropy head."
            )
        policy = self.model.get_base_model() if is_peft_model(self.model) else self.model
        install_entropy_head(policy, self.temperature, args.cast_lm_head_to_fp32)
        if self.ref_model is not None:
            install_entropy_head(self.ref_model, self.temperature, args.cast_lm_head_to_fp32)
        self.controllers: dict[str, Controller] = {c.name: c for c in self.build_controllers()}
        # [Σ m·statistic, Σ m] per controller statistic, summed over the micro-batches of the current generation cycle,
        # and the number of optimizer steps since the last controller update.
        self._cycle_statistics: dict[str, torch.Tensor] = {}
        self._cycle_optimizer_steps = 0
        self._entropy_control_state = EntropyControlState()  # carries the controller state into every checkpoint
        self.add_callback(self._entropy_control_state)

    # ------------------------------------------------------------------------------------------------------------
    # Hooks
    # ------------------------------------------------------------------------------------------------------------

    def build_controllers(self) -> list[Controller]:
        """The controllers this method moves once per generation cycle (none in plain GRPO)."""
        return []

    def clamp_fraction(self) -> float:
        """Fraction of the vocabulary dropped for the clamped entropy; 0 means the loss needs no clamped entropy."""
        return 0.0

    def clip_range(self) -> tuple[float, float]:
        """``(ε_low, ε_high)`` of the PPO clip."""
        return self.epsilon_low, self.epsilon_high

    def per_token_advantages(self, batch: CompletionBatch) -> torch.Tensor:
        """The advantages the surrogate uses: ``(B, 1)`` (one per sequence) or ``(B, T)`` (one per token)."""
        return batch.advantages

    def per_token_policy_loss(
        self, batch: CompletionBatch, ratio: torch.Tensor, advantages: torch.Tensor
    ) -> torch.Tensor:
        """Per-token surrogate ``−min(r·A, clip(r, 1−ε_low, 1+ε_high)·A)`` with TRL's two-sided ``delta`` clip."""
        epsilon_low, epsilon_high = self.clip_range()
        clipped_ratio = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
        if self.args.delta is not None:
            ratio = torch.clamp(ratio, max=self.args.delta)
        return -torch.min(ratio * advantages, clipped_ratio * advantages)

    def regulariser(self, batch: CompletionBatch) -> torch.Tensor | None:
        """A scalar added to the loss of each micro-batch, before the base divides it by the accumulation steps."""
        return None

    # ------------------------------------------------------------------------------------------------------------
    # Rewards
    # ------------------------------------------------------------------------------------------------------------

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        """TRL's rewards, refusing infinite ones.

        TRL maps a ``None`` (or NaN) reward to NaN and leaves such completions out of the group statistics; that stays.
        An infinite reward has no such meaning: it makes the group's advantages NaN (silently zeroed) or, with
        ``scale_rewards="none"``, ±3.4e38, which turns the weights into NaN. The rewards are gathered across ranks
        here, so every rank raises together.
        """
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        infinite = torch.isinf(rewards_per_func)
        if infinite.any():
            row, column = infinite.nonzero()[0].tolist()
            raise ValueError(
                f"reward function {self.reward_func_names[column]!r} returned {rewards_per_func[row, column].item()} "
                f"for completion {row} of the generation batch ({int(infinite.sum())} infinite rewards in all). "
                "Rewards must be finite; return None for a completion the function cannot score."
            )
        return rewards_per_func

    # ------------------------------------------------------------------------------------------------------------
    # Scoring
    # ------------------------------------------------------------------------------------------------------------

    def _score(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, clamp_fraction=0.0, aux_loss=False
    ):
        """Per-token log-probs, entropies, clamped entropies (when ``clamp_fraction > 0``) of the completion, and the
        MoE router loss averaged over the forward passes (when ``aux_loss``), as TRL averages it."""
        request = EntropyHeadRequest(
            logits_to_keep=logits_to_keep,
            clamp_fraction=clamp_fraction,
            chunk_size=self.args.entropy_kernel_chunk_size,
            backend=self.args.entropy_kernel_backend,
            compute_aux_loss=aux_loss,
        )
        batch_size = batch_size or input_ids.size(0)
        outputs = []
        for start in range(0, input_ids.size(0), batch_size):
            with self.accelerator.autocast():
                outputs.append(
                    model(
                        input_ids=input_ids[start : start + batch_size],
                        attention_mask=attention_mask[start : start + batch_size],
                        entropy_head=request,
                    )
                )
        log_probs = torch.cat([o.log_probs for o in outputs])
        entropy = torch.cat([o.entropy for o in outputs])
        clamped = torch.cat([o.clamped_entropy for o in outputs]) if clamp_fraction > 0 else None
        router_loss = torch.stack([o.aux_loss for o in outputs]).mean() if aux_loss else None
        return log_probs, entropy, clamped, router_loss

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
        # on-policy ratio is exactly 1.
        extra = {name: value for name, value in model_inputs.items() if value is not None}
        if extra:
            raise NotImplementedError(f"{type(self).__name__} scores text-only inputs; got {sorted(extra)}.")
        log_probs, entropy, _, router_loss = self._score(
            model, input_ids, attention_mask, logits_to_keep, batch_size, aux_loss=compute_aux_loss
        )
        return log_probs, (entropy if compute_entropy else None), router_loss

    # ------------------------------------------------------------------------------------------------------------
    # The loss step
    # ------------------------------------------------------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        model_inputs = {k: inputs.get(k) for k in ("pixel_values", "image_grid_thw", "num_images", "token_type_ids")}
        if any(value is not None for value in model_inputs.values()):
            raise NotImplementedError(f"{type(self).__name__} trains on text-only inputs.")
        log_probs, entropy, clamped_entropy, router_loss = self._score(
            model,
            input_ids,
            attention_mask,
            completion_ids.size(1),
            clamp_fraction=self.clamp_fraction(),
            aux_loss=self.aux_loss_enabled,
        )
        old_log_probs = inputs.get("old_per_token_logps")
        advantages = inputs["advantages"]
        batch = CompletionBatch(
            log_probs=log_probs,
            old_log_probs=log_probs.detach() if old_log_probs is None else old_log_probs,
            entropy=entropy,
            clamped_entropy=clamped_entropy,
            mask=mask,
            advantages=advantages.unsqueeze(1) if advantages.dim() == 1 else advantages,
        )
        token_advantages = self.per_token_advantages(batch)

        # Tokens kept by TRL's high-entropy filter (top_entropy_quantile < 1); None keeps all.
        entropy_mask = None
        if self.top_entropy_quantile < 1.0:
            entropy_mask = self.get_high_entropy_mask(entropy, mask, 1 - self.top_entropy_quantile)
        batch.entropy_mask = entropy_mask

        log_ratio = log_probs - batch.old_log_probs
        if self.importance_sampling_level == "sequence":
            log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
        ratio = torch.exp(log_ratio)

        per_token_loss = self.per_token_policy_loss(batch, ratio, token_advantages)
        if self.off_policy_mask_threshold is not None:
            per_token_loss = per_token_loss * self.get_off_policy_mask(
                advantages=batch.advantages,
                per_token_logps=log_probs,
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", batch.old_log_probs),
                mask=mask,
                off_policy_threshold=self.off_policy_mask_threshold,
            )
        if entropy_mask is not None:
            per_token_loss = per_token_loss * entropy_mask
        if self.use_vllm and self.vllm_importance_sampling_correction:
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
        if self.beta != 0.0:
            # k3 estimator of KL(π_θ ‖ π_ref), optionally importance-weighted.
            ref_log_ratio = inputs["ref_per_token_logps"] - log_probs
            per_token_kl = torch.exp(ref_log_ratio) - ref_log_ratio - 1
            if self.args.use_bias_correction_kl:
                per_token_kl = per_token_kl * ratio
            per_token_loss = per_token_loss + self.beta * per_token_kl

        policy_loss, divisor = self._aggregate(per_token_loss, mask, inputs, mode)
        loss = policy_loss / divisor
        # Bonuses and regularisers are token means of the micro-batch, scaled only for gradient accumulation.
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        if self._entropy_bonus_enabled:
            bonus_mask = mask if entropy_mask is None else mask * entropy_mask
            loss = loss - self._trl_entropy_bonus(entropy, bonus_mask, policy_loss, mode) / accumulation
        regulariser = self.regulariser(batch)
        if regulariser is not None:
            loss = loss + regulariser / accumulation
        if self.aux_loss_enabled:  # the MoE load-balancing loss, scaled for accumulation as TRL scales it
            loss = loss + self.router_aux_loss_coef * router_loss / accumulation
            self._metrics[mode]["aux_loss"].append(
                self.accelerator.gather_for_metrics(router_loss.detach()).mean().item()
            )

        if mode == "train":
            self._accumulate_controller_statistics(batch)
        self._log_step_metrics(batch, token_advantages, ratio, per_token_kl if self.beta != 0.0 else None, mode)
        return loss

    def _aggregate(self, per_token_loss, mask, inputs, mode) -> tuple[torch.Tensor, float]:
        """Reduce the per-token loss as TRL's ``loss_type`` prescribes.

        Returns the reduced loss and the divisor that scales it for gradient accumulation (dapo's normaliser already
        spans the accumulation window, so its divisor is 1).
        """
        masked = per_token_loss * mask
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        if self.loss_type == "grpo":  # mean over each sequence's tokens, then over sequences
            return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean(), accumulation
        if self.loss_type == "bnpo":  # mean over the micro-batch's tokens
            return masked.sum() / mask.sum().clamp(min=1.0), accumulation
        if self.loss_type == "dr_grpo":  # a constant normaliser: sequences × maximal completion length
            return masked.sum() / (per_token_loss.size(0) * self.max_completion_length), accumulation
        # dapo: mean over every token of the generation batch (all ranks), brought to one accumulation window
        normaliser = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        if mode == "train":
            normaliser = normaliser * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return masked.sum() / normaliser, 1.0

    def _trl_entropy_bonus(self, entropy, mask, policy_loss, mode) -> torch.Tensor:
        """TRL's own entropy bonus (``entropy_coef``, Skywork-OR1's ``use_adaptive_entropy``), the EntReg baseline.

        Returns ``coef · mean entropy`` (the caller subtracts it, scaled for accumulation). The adaptive coefficient
        uses TRL's attributes, so TRL's checkpoint file for it keeps working.
        """
        coefficient = self.entropy_coef
        if self.use_adaptive_entropy and self._last_world_entropy > self.args.entropy_target:
            coefficient = 0.0
        self._metrics[mode]["policy_loss"].append(self.accelerator.gather(policy_loss.detach()).nanmean().item())
        if self.use_adaptive_entropy and mode == "train":
            window = torch.stack([(entropy * mask).sum(), mask.sum()]).detach()
            self._entropy_window_stats = (
                window if self._entropy_window_stats is None else self._entropy_window_stats + window
            )
            if self.accelerator.sync_gradients:
                totals = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
                self._last_world_entropy = (totals[0] / totals[1].clamp(min=1.0)).item()
                step = (
                    self.args.entropy_coef_delta
                    if self._last_world_entropy <= self.args.entropy_target
                    else -self.args.entropy_coef_delta
                )
                self.entropy_coef = min(
                    max(self.entropy_coef + step, self.args.entropy_coef_min), self.args.entropy_coef_max
                )
                self._entropy_window_stats = None
        if mode == "train" and self.accelerator.sync_gradients:
            self._metrics[mode]["entropy_coef"].append(self.entropy_coef)
        return coefficient * masked_mean(entropy, mask)

    # ------------------------------------------------------------------------------------------------------------
    # Controllers: cycle statistics, one update per generation cycle, checkpoints
    # ------------------------------------------------------------------------------------------------------------

    def _accumulate_controller_statistics(self, batch: CompletionBatch) -> None:
        """Add the micro-batch's ``[Σ m·statistic, Σ m]`` to the generation cycle's sums; at the optimizer step that
        ends the cycle, update the controllers (SPEC "Controller statistics and timing").

        A cycle is ``num_iterations · steps_per_generation`` micro-batches, an optimizer step
        ``gradient_accumulation_steps``. The update happens at the first optimizer step that ends together with a
        cycle: under TRL's defaults every optimizer step; with ``num_iterations = 2`` every second one; when one
        optimizer step spans several cycles, once per optimizer step.
        """
        if not self.controllers:
            return
        for statistic in sorted({c.statistic for c in self.controllers.values()}):
            values = getattr(batch, statistic)
            if values is None:
                raise RuntimeError(
                    f"a controller needs the {statistic!r} statistic, which this method does not compute"
                )
            sums = torch.stack([(values.detach().float() * batch.mask).sum(), batch.mask.float().sum()])
            previous = self._cycle_statistics.get(statistic)
            self._cycle_statistics[statistic] = sums if previous is None else previous + sums
        if not self.accelerator.sync_gradients:
            return
        self._cycle_optimizer_steps += 1
        micro_batches = self._cycle_optimizer_steps * self.args.gradient_accumulation_steps
        if micro_batches % (self.args.steps_per_generation * self.num_iterations) == 0:
            self._update_controllers()
        for controller in self.controllers.values():
            for metric, value in controller.metrics().items():
                self._metrics["train"][metric].append(value)

    def _update_controllers(self) -> None:
        """Reduce the cycle's sums across ranks and update every controller identically on each rank."""
        totals = self._world_cycle_statistics()
        self._cycle_statistics, self._cycle_optimizer_steps = {}, 0
        means = {name: total / count if count > 0 else math.nan for name, (total, count) in totals.items()}
        step = self.state.global_step + 1  # the optimizer step that ends the cycle
        for controller in self.controllers.values():
            mean = means[controller.statistic]
            if math.isfinite(mean):
                controller.update(mean, step)
            else:  # no valid token on any rank, or a non-finite statistic: hold the controller where it is
                warnings.warn(
                    f"generation cycle ending at optimizer step {step}: the {controller.statistic} statistic is "
                    f"{mean}; controller {controller.name!r} keeps its value",
                    stacklevel=2,
                )

    def _world_cycle_statistics(self) -> dict[str, list[float]]:
        """The current cycle's ``[Σ m·statistic, Σ m]`` per statistic, summed over all ranks (every rank calls it)."""
        names = sorted(self._cycle_statistics)
        if not names:
            return {}
        totals = self.accelerator.reduce(torch.stack([self._cycle_statistics[n] for n in names]), reduction="sum")
        return dict(zip(names, totals.tolist(), strict=True))

    def _entropy_control_snapshot(self) -> dict:
        """The controllers' state and the progress of the current generation cycle, for a checkpoint.

        The cycle's partial sums are reduced across ranks here (every rank saves), so the snapshot is the same on every
        rank; on resume process 0 takes them over and the others start from zero, which gives the same world sums.
        """
        return {
            "controllers": {name: controller.state_dict() for name, controller in self.controllers.items()},
            "cycle_statistics": self._world_cycle_statistics(),
            "cycle_optimizer_steps": self._cycle_optimizer_steps,
            "trl_step": self._step,  # TRL's micro-batch counter: where the buffered generation batch is in its cycle
            "num_processes": self.accelerator.num_processes,
        }

    def _save_checkpoint(self, model, trial):
        # Everything goes into the checkpoint folder before Trainer's own save, which pushes the folder to the Hub
        # (push_to_hub) as its last step: the snapshot rides in trainer_state.json through the stateful callback.
        state = self._entropy_control_state
        state.snapshot = self._entropy_control_snapshot()
        self.state.stateful_callbacks[EntropyControlState.__name__] = state.state()  # Trainer updates only known keys
        if self._step % (self.args.steps_per_generation * self.num_iterations) != 0:
            # Inside a generation cycle: the rest of the cycle trains on the buffered generation batch, which a fresh
            # trainer would otherwise regenerate from the updated policy.
            folder = os.path.join(
                self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            )
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, GENERATION_BATCH_FILE.format(process_index=self.accelerator.process_index))
            torch.save(self._buffered_inputs, path)
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        stored = self.state.stateful_callbacks.get(EntropyControlState.__name__) or {}
        snapshot = stored.get("attributes", {}).get("snapshot")
        if snapshot is None:
            if self.controllers:
                raise ValueError(
                    f"{checkpoint} holds no entropy-control state (trainer_state.json, stateful_callbacks."
                    f"{EntropyControlState.__name__}), so resuming {type(self).__name__} would restart the "
                    f"controllers {sorted(self.controllers)} from their initial values"
                )
            return
        missing = sorted(set(self.controllers) - set(snapshot["controllers"]))
        if missing:
            raise ValueError(f"{checkpoint} holds no state for the controllers {missing}")
        for name, controller in self.controllers.items():
            controller.load_state_dict(snapshot["controllers"][name])
        device = self.accelerator.device
        self._cycle_statistics = {
            name: torch.tensor(sums, device=device) * (1.0 if self.accelerator.is_main_process else 0.0)
            for name, sums in snapshot["cycle_statistics"].items()
        }
        self._cycle_optimizer_steps = snapshot["cycle_optimizer_steps"]
        self._step = snapshot["trl_step"]
        if self._step % (self.args.steps_per_generation * self.num_iterations) != 0:
            path = os.path.join(checkpoint, GENERATION_BATCH_FILE.format(process_index=self.accelerator.process_index))
            if snapshot["num_processes"] != self.accelerator.num_processes or not os.path.exists(path):
                raise ValueError(
                    f"{checkpoint} was saved inside a generation cycle by {snapshot['num_processes']} processes; "
                    f"resuming it needs {path} and as many processes (this run has {self.accelerator.num_processes})"
                )
            # Loaded on the CPU first: torch.load cannot map onto an indexed CPU device ("cpu:0", multi-process CPU).
            self._buffered_inputs = send_to_device(torch.load(path, map_location="cpu", weights_only=True), device)

    # ------------------------------------------------------------------------------------------------------------
    # Metrics
    # ------------------------------------------------------------------------------------------------------------

    def _global_mean(self, values: torch.Tensor, mask: torch.Tensor) -> float:
        """Token-weighted mean over all ranks; ``(B, 1)`` values count once per sequence."""
        if values.size(1) == 1:
            sums = torch.stack(
                [values.detach().float().sum(), torch.tensor(float(values.size(0)), device=values.device)]
            )
        else:
            sums = torch.stack([(values.detach().float() * mask).sum(), mask.float().sum()])
        totals = self.accelerator.reduce(sums, reduction="sum")
        return (totals[0] / totals[1].clamp(min=1.0)).item()

    def _log_step_metrics(self, batch, token_advantages, ratio, per_token_kl, mode) -> None:
        metrics, mask = self._metrics[mode], batch.mask
        if per_token_kl is not None:
            metrics["kl"].append(self._global_mean(per_token_kl, mask))
        metrics["entropy"].append(self._global_mean(batch.entropy, mask))
        if batch.clamped_entropy is not None:
            metrics["entropy/clamped"].append(self._global_mean(batch.clamped_entropy, mask))
        moments = self.accelerator.reduce(covariance_moments(batch.log_probs, token_advantages, mask), reduction="sum")
        metrics["entropy/cov_logp_adv"].append(covariance_from_moments(moments))
        epsilon_low, epsilon_high = self.clip_range()
        low = (ratio < 1 - epsilon_low) & (token_advantages < 0)
        high = (ratio > 1 + epsilon_high) & (token_advantages > 0)
        metrics["clip_ratio/low_mean"].append(self._global_mean(low.float(), mask))
        metrics["clip_ratio/high_mean"].append(self._global_mean(high.float(), mask))
        metrics["clip_ratio/region_mean"].append(self._global_mean((low | high).float(), mask))
        metrics["clip_ratio/low_min"].append(
            nanmin(self.accelerator.gather(self._sequence_means(low.float(), mask))).item()
        )
        metrics["clip_ratio/high_max"].append(
            nanmax(self.accelerator.gather(self._sequence_means(high.float(), mask))).item()
        )

    @staticmethod
    def _sequence_means(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Per-sequence token mean (NaN for a sequence with no valid token); ``(B, 1)`` values stay as they are."""
        if values.size(1) == 1:
            return values.squeeze(1)
        return (values * mask).sum(-1) / mask.sum(-1)
