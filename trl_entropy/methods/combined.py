"""`EntropyGRPOConfig`: every registered method's config as a base, training the methods that its
`entropy_control` names (`methods/selection.py`). Written by `python docs/tables.py --write` from the
registry: do not edit by hand."""

from dataclasses import dataclass, field

from ..core.config import Range, config_field
from .adapo import ADAPOConfig
from .aent import AEntConfig
from .ce_gppo import CEGPPOConfig
from .clip_cov import ClipCovConfig
from .ent_adv import EntropyAdvantageConfig
from .entrocraft import EntrocraftConfig
from .entropic import EntroPICConfig
from .erc import ERCConfig
from .kl_cov import KLCovConfig
from .qae import QAEConfig
from .repo import REPOConfig
from .selection import MethodsSelection
from .siren import SIRENConfig
from .steer import STEERConfig


@dataclass
class EntropyGRPOConfig(
    MethodsSelection,
    SIRENConfig,
    EntrocraftConfig,
    STEERConfig,
    EntroPICConfig,
    ERCConfig,
    CEGPPOConfig,
    EntropyAdvantageConfig,
    QAEConfig,
    ADAPOConfig,
    REPOConfig,
    KLCovConfig,
    ClipCovConfig,
    AEntConfig,
):
    """Configuration for [`EntropyGRPOTrainer`]: every field of [`EntropyGRPOBaseConfig`] and of every
    method's config, training the methods `entropy_control` names (docs/composing.md). A method's field left
    at None takes the selected method's default."""

    entropy_coef: float | None = field(
        default=None,
        metadata={
            "help": (
                "Coefficient of the entropy regularization term in the loss. A positive value adds an entropy bonus "
                "that encourages exploration. The bonus is always the mean per-token entropy regardless of "
                "`loss_type` (not rescaled to a loss type's policy normalization), so `entropy_coef` has the same "
                "meaning for every loss type. When `use_adaptive_entropy=True`, this serves as the initial "
                "coefficient and is updated each optimizer step. Has no effect when set to `0.0` (default). None: the "
                "selected method's default, else 0.0."
            )
        },
    )

    epsilon_high: float | None = field(
        default=None,
        metadata={
            "help": (
                "Upper-bound epsilon value for clipping. If not specified, it defaults to the same value as the "
                "lower-bound specified in argument `epsilon`. Paper DAPO recommends `0.28`. When used with "
                "`loss_type='cispo'`, this corresponds to the ε_max param specified in the [ScaleRL "
                "paper](https://huggingface.co/papers/2510.13786) and the recommended value is `5.0`."
            )
        },
    )

    aent_clamp_fraction: float | None = config_field(
        None,
        (
            "AEnt clamp fraction p: the floor(p*V) smallest logits of each position are dropped before the clamped "
            "entropy is computed; 0 <= p < 1, 0 gives the full entropy. Default: the reference implementation (AReaL "
            "recipe/AEnt). None: the selected method's default (0.3)."
        ),
        valid=Range(low=0, high=1, ends="[)"),
        none_means="(the selected method's default, 0.3)",
    )

    aent_coef_init: float | None = config_field(
        None,
        (
            "Initial coefficient lambda_0 of the clamped-entropy bonus. Must lie in [aent_coef_min, aent_coef_max] "
            "when aent_adaptive is on; any value >= 0 when it is off. Default: the reference implementation (AReaL "
            "recipe/AEnt). None: the selected method's default (0.0002)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 0.0002)",
    )

    aent_entropy_low: float | None = config_field(
        None,
        (
            "Lower edge H_low of the clamped-entropy band: while the step's mean clamped entropy is below it, the "
            "coefficient rises. Default: the reference implementation (AReaL recipe/AEnt). None: the selected "
            "method's default (0.05)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 0.05)",
    )

    aent_entropy_high: float | None = config_field(
        None,
        (
            "Upper edge H_high of the clamped-entropy band: while the step's mean clamped entropy is above it, the "
            "coefficient falls. Default: the reference implementation (AReaL recipe/AEnt). None: the selected "
            "method's default (0.23)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 0.23)",
    )

    aent_coef_lr: float | None = config_field(
        None,
        (
            "Learning rate alpha of the coefficient controller (>= 0). Default: the reference implementation (AReaL "
            "recipe/AEnt). None: the selected method's default (0.001)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 0.001)",
    )

    aent_coef_min: float | None = config_field(
        None,
        (
            "Lower bound lambda_min of the coefficient box (>= 0). Default: the reference implementation (AReaL "
            "recipe/AEnt). None: the selected method's default (1e-05)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 1e-05)",
    )

    aent_coef_max: float | None = config_field(
        None,
        (
            "Upper bound lambda_max of the coefficient box (>= aent_coef_min). Default: the reference implementation "
            "(AReaL recipe/AEnt). None: the selected method's default (0.003)."
        ),
        valid=Range(),
        none_means="(the selected method's default, 0.003)",
    )

    aent_warmup_steps: int | None = config_field(
        None,
        (
            "Optimizer steps during which the coefficient stays at aent_coef_init; it is updated after each "
            "generation cycle whose last optimizer step's 1-based index exceeds this. Default 0 from the reference "
            "implementation's defaults (its example run used 29). None: the selected method's default (0)."
        ),
        valid=Range(low=0, integer=True),
        none_means="(the selected method's default, 0)",
    )

    aent_adaptive: bool | None = config_field(
        None,
        (
            "Adapt the coefficient to keep the clamped entropy in [aent_entropy_low, aent_entropy_high]; False keeps "
            "it at aent_coef_init for the whole run. Default True (the paper's method). None: the selected method's "
            "default (True)."
        ),
        none_means="(the selected method's default, True)",
        flag=True,
    )

    aent_schedule: str | None = config_field(
        None,
        (
            "Schedule of aent_entropy_low, aent_entropy_high, aent_coef_min and aent_coef_max over training: "
            "'constant' (fixed), or 'linear' or 'cosine' from each bound's value to its final value "
            "(aent_entropy_low_final, aent_entropy_high_final, aent_coef_min_final, aent_coef_max_final; a bound "
            "without one stays fixed), after aent_schedule_warmup_steps, over aent_schedule_decay_steps, on the clock "
            "of entropy_schedule_unit. See docs/schedules.md. None: the selected method's default ('constant')."
        ),
        choices=("constant", "linear", "cosine"),
        none_means="(the selected method's default, 'constant')",
    )

    aent_entropy_low_final: float | None = config_field(
        None,
        (
            "Final value of aent_entropy_low under aent_schedule, reached at the run's last step (or after "
            "aent_schedule_decay_steps). None: the selected method's default (None)."
        ),
        valid=Range(low=0),
        none_means="(aent_entropy_low stays fixed)",
    )

    aent_entropy_high_final: float | None = config_field(
        None,
        (
            "Final value of aent_entropy_high under aent_schedule, reached at the run's last step (or after "
            "aent_schedule_decay_steps). None: the selected method's default (None)."
        ),
        valid=Range(low=0),
        none_means="(aent_entropy_high stays fixed)",
    )

    aent_coef_min_final: float | None = config_field(
        None,
        (
            "Final value of aent_coef_min under aent_schedule, reached at the run's last step (or after "
            "aent_schedule_decay_steps). None: the selected method's default (None)."
        ),
        valid=Range(low=0),
        none_means="(aent_coef_min stays fixed)",
    )

    aent_coef_max_final: float | None = config_field(
        None,
        (
            "Final value of aent_coef_max under aent_schedule, reached at the run's last step (or after "
            "aent_schedule_decay_steps). None: the selected method's default (None)."
        ),
        valid=Range(low=0),
        none_means="(aent_coef_max stays fixed)",
    )

    aent_schedule_warmup_steps: int | None = config_field(
        None,
        (
            "Steps (or cycles, see entropy_schedule_unit) during which aent_entropy_low, aent_entropy_high, "
            "aent_coef_min and aent_coef_max hold their start values before aent_schedule moves them; 0: no warm-up. "
            "None: the selected method's default (0)."
        ),
        valid=Range(low=0, integer=True),
        none_means="(the selected method's default, 0)",
    )

    aent_schedule_decay_steps: int | None = config_field(
        None,
        (
            "Steps (or cycles) from the end of aent_schedule_warmup_steps to the final values of aent_entropy_low, "
            "aent_entropy_high, aent_coef_min and aent_coef_max. None: the selected method's default (None)."
        ),
        valid=Range(low=1, integer=True),
        none_means="(to the run's last step, max_steps)",
    )

    cov_selection_scope: str | None = config_field(
        None,
        (
            "Where Clip-Cov/KL-Cov select their tokens. 'micro_batch' (default, the authors' code): in every loss "
            "step over its micro-batch on its rank, from the current log-probs; the selection depends on the "
            "micro-batch size, accumulation and number of processes. 'generation_batch' (ours): once per generation "
            "batch over the whole batch on all ranks, from the rollout log-probs (one extra no-gradient forward pass "
            "per generation batch where TRL does not compute them); the selection is the same for any layout. None: "
            "the selected method's default ('micro_batch')."
        ),
        choices=("micro_batch", "generation_batch"),
        none_means="(the selected method's default, 'micro_batch')",
    )

    clip_cov_ratio: float | None = config_field(
        None,
        (
            "ρ: fraction of the valid tokens to detach, max(floor(ρ·N_valid), 1) tokens drawn at random among the "
            "candidates, N_valid counted over the selection scope (micro-batch or generation batch). In (0, 1]. "
            "Default from the paper (Cui et al., arXiv:2505.22617, §4.3) and verl. None: the selected method's "
            "default (0.0002)."
        ),
        valid=Range(low=0, high=1, ends="(]"),
        none_means="(the selected method's default, 0.0002)",
        note="(a fraction of the valid tokens)",
    )

    clip_cov_lb: float | None = config_field(
        None,
        (
            "Lower bound (exclusive) of a candidate's covariance (ℓ_t − ℓ̄)(A_t − Ā). Default from the paper (Cui et "
            "al., arXiv:2505.22617, §4.3) and verl. None: the selected method's default (1.0)."
        ),
        valid=Range(finite=False),
        none_means="(the selected method's default, 1.0)",
    )

    clip_cov_ub: float | None = config_field(
        None,
        (
            "Upper bound (exclusive) of a candidate's covariance; must exceed clip_cov_lb. Default from the paper "
            "(Cui et al., arXiv:2505.22617, §4.3) and verl. None: the selected method's default (5.0)."
        ),
        valid=Range(finite=False),
        none_means="(the selected method's default, 5.0)",
    )

    kl_cov_ratio: float | None = config_field(
        None,
        (
            "κ: fraction of the valid tokens penalised, the top max(floor(κ·N_valid), 1) by covariance, N_valid "
            "counted over the selection scope (micro-batch or generation batch). In (0, 1]. Default from the paper's "
            "7B setting (Cui et al., arXiv:2505.22617, §4.3); it used 2e-4 at 32B. None: the selected method's "
            "default (0.002)."
        ),
        valid=Range(low=0, high=1, ends="(]"),
        none_means="(the selected method's default, 0.002)",
        note="(a fraction of the valid tokens)",
    )

    kl_cov_coef: float | None = config_field(
        None,
        (
            "β_KL: weight of the penalty |ℓ_t − ℓ^old_t| on the selected tokens; >= 0. Default from the paper (Cui et "
            "al., arXiv:2505.22617, §4.3) and verl. None: the selected method's default (1.0)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 1.0)",
    )

    repo_variant: str | None = config_field(
        None,
        (
            "'R' (REPO-R, rescale: zeta_t = |A_t| (logp^s_t - c_t); the variant of the paper's experiments) or 'D' "
            "(REPO-D, decorrelate: zeta_t = logp^s_t - c_t, an entropy bonus estimated by REINFORCE). None: the "
            "selected method's default (the one the method's name stands for)."
        ),
        choices=("R", "D"),
        none_means="(the selected method's default, the one the method's name stands for)",
    )

    repo_centering: str | None = config_field(
        None,
        (
            "Centring c_t of the sampled log-prob: 'none' (c_t = 0, the paper's practical choice) or 'entropy' (c_t = "
            "-H_t, the exact per-state centring; H_t is detached). None: the selected method's default ('none')."
        ),
        choices=("none", "entropy"),
        none_means="(the selected method's default, 'none')",
    )

    repo_beta: float | None = config_field(
        None,
        (
            "Initial beta of the per-token advantage A'_t = A_t - beta * zeta_t (paper: 0; the first update then sets "
            "it to +-repo_beta_min). |repo_beta| must not exceed repo_beta_max. None: the selected method's default "
            "(0.0)."
        ),
        valid=Range(),
        none_means="(the selected method's default, 0.0)",
    )

    repo_beta_min: float | None = config_field(
        None,
        (
            "Smallest |beta|: when halving takes |beta| below it, beta flips to +-repo_beta_min in the wanted "
            "direction. 1e-4 is the paper's REPO-R value; for REPO-D the same value is ours. None: the selected "
            "method's default (0.0001)."
        ),
        valid=Range(low=0, ends="(]"),
        none_means="(the selected method's default, 0.0001)",
    )

    repo_beta_max: float | None = config_field(
        None,
        (
            "Largest |beta|; doubling stops there. 0.05 is the paper's REPO-R value; for REPO-D the same value is "
            "ours (the paper's REPO-D range did not survive extraction). None: the selected method's default (0.05)."
        ),
        valid=Range(),
        none_means="(the selected method's default, 0.05)",
    )

    repo_entropy_target: float | None = config_field(
        None,
        (
            "REPO's target mean full entropy H* (nats per token). None (default, paper) measures it on the first "
            "generation cycle. None: the selected method's default (None)."
        ),
        valid=Range(low=0, ends="(]"),
        none_means="to measure it on the first generation cycle",
    )

    repo_keep_advantage_sign: bool | None = config_field(
        None,
        (
            "REPO-R: clamp the factor 1 - beta * sign(A) * (logp^s - c) at 0 so the rescaled advantage keeps the sign "
            "of A (the public re-implementation of the paper's App. D.2). False leaves it unclamped. None: the "
            "selected method's default (True)."
        ),
        none_means="(the selected method's default, True)",
        flag=True,
    )

    adapo_epsilon_high_step: float | None = config_field(
        None,
        (
            "Step delta of epsilon_high per generation cycle (ours: the paper gives no value). None: the selected "
            "method's default (0.01)."
        ),
        valid=Range(low=0, ends="(]"),
        none_means="(the selected method's default, 0.01)",
    )

    adapo_epsilon_high_min: float | None = config_field(
        None,
        (
            "Lower bound of epsilon_high (ours: the paper's range did not survive extraction). None: the selected "
            "method's default (0.1)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 0.1)",
    )

    adapo_epsilon_high_max: float | None = config_field(
        None,
        (
            "Upper bound of epsilon_high (ours: the paper's range did not survive extraction). None: the selected "
            "method's default (0.5)."
        ),
        valid=Range(),
        none_means="(the selected method's default, 0.5)",
    )

    adapo_entropy_target: float | None = config_field(
        None,
        (
            "ADAPO's target mean full entropy H* (nats per token). None (default, paper) measures it on the first "
            "generation cycle. None: the selected method's default (None)."
        ),
        valid=Range(low=0, ends="(]"),
        none_means="to measure it on the first generation cycle",
    )

    qae_quantile_k: float | None = config_field(
        None,
        (
            "Quantile level K of QAE's group baseline b = Q_K(rewards), in (0, 1), linear interpolation between order "
            "statistics. 0.4 is the authors' training scripts' value (Qwen3-8B/14B-Base, DAPO). None: the selected "
            "method's default (0.4)."
        ),
        valid=Range(low=0, high=1, ends="()"),
        none_means="(the selected method's default, 0.4)",
        note="(the authors' code falls back to the mean outside (0, 1): use method grpo for that)",
    )

    ent_adv_alpha: float | None = config_field(
        None,
        (
            "Coefficient alpha of the detached entropy in the advantage term min(alpha * H_t, |A_t| / kappa). 0.4 is "
            "the paper's value with GRPO (0.1 with PPO); 0 turns the term off (plain GRPO). None: the selected "
            "method's default (0.4)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 0.4)",
        note="(0 turns the entropy term off)",
    )

    ent_adv_kappa: float | None = config_field(
        None,
        (
            "Cap divisor kappa: the advantage term never exceeds |A_t| / kappa, so a negative advantage stays "
            "negative. 2 is the paper's value. None: the selected method's default (2.0)."
        ),
        valid=Range(low=1, ends="()"),
        none_means="(the selected method's default, 2.0)",
        note="(the term is capped at |A| / kappa: below |A|, so a negative advantage keeps its sign)",
    )

    ce_gppo_beta1: float | None = config_field(
        None,
        (
            "beta1: gradient scale of the tokens clipped below (ratio < 1 - epsilon, negative advantage); their loss "
            "is -beta1 * (1 - epsilon) * A * r / sg(r). 0.5 is the authors' 1.5B script (0.75 their 7B script, 0.25 "
            "their config's default); 0 gives these tokens no gradient, as PPO does. None: the selected method's "
            "default (0.5)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 0.5)",
    )

    ce_gppo_beta2: float | None = config_field(
        None,
        (
            "beta2: gradient scale of the tokens clipped above (ratio > 1 + epsilon_high, positive advantage); their "
            "loss is -beta2 * (1 + epsilon_high) * A * r / sg(r). 1.0 is the authors' scripts and config; 0 gives "
            "these tokens no gradient, as PPO does. None: the selected method's default (1.0)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 1.0)",
    )

    erc_low: float | None = config_field(
        None,
        (
            "Lower bound L (exclusive) of the entropy ratio rho = (H + 1e-8) / (H_old + 1e-8): a token with rho <= L "
            "loses its policy gradient. 0 <= L < 1. 0.95 is the authors' training scripts' value (their config "
            "default: 0.8). None: the selected method's default (0.95)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 0.95)",
    )

    erc_high: float | None = config_field(
        None,
        (
            "Upper bound U (exclusive) of the entropy ratio: a token with rho >= U loses its policy gradient. U > 1; "
            "inf allowed (erc_low=0 with erc_high=inf keeps every token). 1.05 is the authors' training scripts' "
            "value (their config default: 1.2). None: the selected method's default (1.05)."
        ),
        valid=Range(low=0, ends="(]", finite=False),
        none_means="(the selected method's default, 1.05)",
    )

    entropic_target: float | None = config_field(
        None,
        (
            "Target entropy H* (nats per token, of softmax(logits / temperature), as TRL's entropy metric). 0.1 is "
            "the authors' run_entropic.sh value, at rollout temperature 0.6; must be > 0 (the authors' code breaks at "
            "0). None: the selected method's default (0.1)."
        ),
        valid=Range(low=0, ends="(]"),
        none_means="(the selected method's default, 0.1)",
    )

    entropic_kp: float | None = config_field(
        None,
        (
            "Proportional gain K_p of the controller (>= 0). 1 is the authors' run_entropic.sh value. None: the "
            "selected method's default (1.0)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 1.0)",
    )

    entropic_ki: float | None = config_field(
        None,
        (
            "Integral gain K_i of the controller (>= 0). 0.01 is the authors' run_entropic.sh value. None: the "
            "selected method's default (0.01)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 0.01)",
    )

    entropic_high_prob: float | None = config_field(
        None,
        (
            "Probability threshold tau in (0, 1): the term covers the valid tokens whose current probability exceeds "
            "it. 0.95 is the authors' default (core_algos.py). None: the selected method's default (0.95)."
        ),
        valid=Range(low=0, high=1, ends="()"),
        none_means="(the selected method's default, 0.95)",
    )

    steer_mapping: str | None = config_field(
        None,
        (
            "Mapping from the estimated entropy change |Omega| to the token weight: 'exponential' (clamp(exp(-kappa "
            "|Omega|), weight_min, 1), the paper's and the authors' run_exp.sh) or 'linear' (min-max between "
            "steer_weight_min and steer_weight_max, the authors' run_linear.sh and their function's default). None: "
            "the selected method's default ('exponential')."
        ),
        choices=("exponential", "linear"),
        none_means="(the selected method's default, 'exponential')",
    )

    steer_weight_min: float | None = config_field(
        None,
        (
            "Smallest token weight: lambda_min of the exponential mapping (0 < lambda_min <= 1; the token with the "
            "largest |Omega| gets it), w_min of the linear one (>= 0). 0.8 in both of the authors' scripts. None: the "
            "selected method's default (0.8)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 0.8)",
    )

    steer_weight_max: float | None = config_field(
        None,
        (
            "Largest token weight of the linear mapping, w_max >= steer_weight_min (the authors' function default "
            "1.2); the exponential mapping's largest weight is 1 and takes no field. None: the selected method's "
            "default (1.2)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 1.2)",
    )

    entrocraft_variant: str | None = config_field(
        None,
        (
            "'code' (the authors' code: above the band RAFT++ max(R - offset, 0), below it NSR min(R - offset, 0), "
            "inside it GRPO's own advantages; on the group-baseline axis) or 'sign' (ours, the estimator-agnostic "
            "form of the paper's abstract: the group baseline's advantages with the negative ones zeroed above the "
            "band and the positive ones below it; on the rollout-rejection axis, after any group baseline). None: the "
            "selected method's default (the one the method's name stands for)."
        ),
        choices=("code", "sign"),
        none_means="(the selected method's default, the one the method's name stands for)",
    )

    entrocraft_shape: str | None = config_field(
        None,
        (
            "How the band moves from its start to its end values: 'linear' (the authors' reference run), 'cosine' "
            "(g(u) = (1 - cos(pi u))/2) or 'fixed' (the start values throughout). None: the selected method's default "
            "('linear')."
        ),
        choices=("linear", "cosine", "fixed"),
        none_means="(the selected method's default, 'linear')",
    )

    entrocraft_lower_start: float | None = config_field(
        None,
        (
            "Lower bound L_0 of the band in the first cycle (nats); the authors' reference run. None: the selected "
            "method's default (0.6)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 0.6)",
    )

    entrocraft_lower_end: float | None = config_field(
        None,
        (
            "Lower bound L_1 of the band in the last cycle (nats); the authors' reference run. None: the selected "
            "method's default (0.4)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 0.4)",
    )

    entrocraft_upper_start: float | None = config_field(
        None,
        (
            "Upper bound U_0 >= L_0 of the band in the first cycle (nats); the authors' reference run. None: the "
            "selected method's default (0.7)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 0.7)",
    )

    entrocraft_upper_end: float | None = config_field(
        None,
        (
            "Upper bound U_1 >= L_1 of the band in the last cycle (nats); the authors' reference run. None: the "
            "selected method's default (0.5)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 0.5)",
    )

    entrocraft_reward_offset: float | None = config_field(
        None,
        (
            "Offset b_0 of the 'code' variant's raw branches, max(R - b_0, 0) and min(R - b_0, 0). 0 is the authors' "
            "(their rewards are +-1); with 0/1 rewards 0.5 gives their sign pattern at half the scale. None: the "
            "selected method's default (0.0)."
        ),
        valid=Range(unbounded_because="a shift of the rewards, whatever their scale"),
        none_means="(the selected method's default, 0.0)",
    )

    entrocraft_entropy_source: str | None = config_field(
        None,
        (
            "Where the cycle's entropy comes from: 'rollout' (the authors': the generation batch's rollout entropy; "
            "one pass without gradient per cycle where TRL computes no rollout log-probs) or 'previous_cycle' (ours: "
            "the previous cycle's training entropy; free, one cycle late: the first cycle keeps GRPO's advantages). "
            "None: the selected method's default ('rollout')."
        ),
        choices=("rollout", "previous_cycle"),
        none_means="(the selected method's default, 'rollout')",
    )

    siren_coef: float | None = config_field(
        None,
        (
            "Coefficient c of the penalty c (H - H_anchor)^2; the authors' siren.sh. None: the selected method's "
            "default (0.005)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 0.005)",
    )

    siren_coef_schedule: str | None = config_field(
        None,
        (
            "Schedule of SIREN's penalty coefficient c (siren_coef) over training: 'constant', or 'linear' or "
            "'cosine' to siren_coef_final (reached after the last step), after siren_coef_warmup_steps, on the clock "
            "of entropy_schedule_unit. See docs/schedules.md. None: the selected method's default ('constant')."
        ),
        choices=("constant", "linear", "cosine"),
        none_means="(the selected method's default, 'constant')",
    )

    siren_coef_final: float | None = config_field(
        None,
        (
            "Final value of siren_coef under a 'linear' or 'cosine' siren_coef_schedule. None: the selected method's "
            "default (None)."
        ),
        valid=Range(low=0),
        none_means="(no final value: the schedule must be 'constant')",
    )

    siren_coef_warmup_steps: int | None = config_field(
        None,
        (
            "Steps (or cycles, see entropy_schedule_unit) over which siren_coef rises linearly from "
            "siren_coef_warmup_start; 0: no warm-up. None: the selected method's default (0)."
        ),
        valid=Range(low=0, integer=True),
        none_means="(the selected method's default, 0)",
    )

    siren_coef_warmup_start: float | None = config_field(
        None,
        (
            "SIREN's penalty coefficient c at the start of siren_coef_warmup_steps. None: the selected method's "
            "default (0.0)."
        ),
        valid=Range(low=0),
        none_means="(the selected method's default, 0.0)",
    )

    siren_coef_decay_steps: int | None = config_field(
        None,
        (
            "Steps (or cycles) from the end of the warm-up to siren_coef_final. None: the selected method's default "
            "(None)."
        ),
        valid=Range(low=1, integer=True),
        none_means="(to the run's last step, max_steps)",
    )

    siren_top_p: float | None = config_field(
        None,
        (
            "Mass p of the top-p set: the logits ranked down while their cumulative full-softmax mass stays below p "
            "(the token that crosses p is left out, as in the authors' code); 0 < p <= 1. The authors' dp_actor.py. "
            "None: the selected method's default (0.8)."
        ),
        valid=Range(low=0, high=1, ends="(]"),
        none_means="(the selected method's default, 0.8)",
    )

    siren_top_k: int | None = config_field(
        None,
        (
            "At most this many largest logits make the top-p set (>= 1); the authors' dp_actor.py. None: the selected "
            "method's default (10000)."
        ),
        valid=Range(low=1, integer=True),
        none_means="(the selected method's default, 10000)",
    )

    siren_mask_ratio: float | None = config_field(
        None,
        (
            "Quantile rho of the peak-entropy mask: per sequence, only the tokens whose top-p entropy is above the "
            "rho-quantile of the sequence's enter the penalty; 0 <= rho < 1. The authors' siren.sh. None: the "
            "selected method's default (0.8)."
        ),
        valid=Range(low=0, high=1, ends="[)"),
        none_means="(the selected method's default, 0.8)",
    )

    siren_anchor: float | None = config_field(
        None,
        (
            "The anchor H_anchor (nats). None measures it, as the authors do, on the first generation batch under the "
            "rollout policy, once; a checkpoint carries it. None: the selected method's default (None)."
        ),
        valid=Range(low=0),
        none_means="(measured on the first generation batch)",
    )

    siren_include_crossing: bool | None = config_field(
        None,
        (
            "Keep the token whose cumulative mass crosses siren_top_p in the top-p set, as standard nucleus sampling "
            "does (ours); False leaves it out, as the authors' code does. None: the selected method's default "
            "(False)."
        ),
        none_means="(the selected method's default, False)",
        flag=True,
    )
