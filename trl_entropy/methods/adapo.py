"""ADAPO: adaptive asymmetric clipping on DAPO ("Entropy-Preserving Reinforcement Learning", Petrenko et al.,
arXiv:2603.11682, §5.2; docs/adapo.md).

DAPO clips the importance ratio asymmetrically, ``clip(r, 1 − ε_low, 1 + ε_high)`` with ``ε_high > ε_low``: a larger
``ε_high`` lets low-probability tokens with positive advantage grow further, which raises entropy (arXiv:2603.11682
§3; Park et al., "Clip-Low Increases Entropy and Clip-High Decreases Entropy in Reinforcement Learning of Large
Language Models", arXiv:2509.26114). ADAPO keeps ``ε_low`` fixed and moves ``ε_high`` once per generation cycle so that
the mean full entropy tracks a target: up by ``δ`` when the entropy is below the target, down by ``δ`` when above,
clamped to ``[ε_high_min, ε_high_max]``. The target is the mean entropy of the first cycle unless given. Clipping only
binds where ratios leave 1, so ADAPO acts only off-policy (``num_iterations > 1`` or ``steps_per_generation >
gradient_accumulation_steps``); on-policy its config warns.
"""

from dataclasses import dataclass
from typing import ClassVar

from ..core.citation import Paper, method_paper, model_card_tags
from ..core.config import (
    ENTROPY_TARGET,
    EntropyGRPOBaseConfig,
    Range,
    config_field,
    reject_trl_entropy_bonus,
    warn_if_on_policy,
)
from ..core.control import Controller, EntropyTargetController, entropy_direction
from ..core.parts import MethodPart
from ..core.trainer import EntropyGRPOTrainer
from ..core.trl.objectives import PPO_CLIP_LOSS_TYPES
from .spec import MethodDocs, MethodSpec, Metric, Neutral, Place


def adapo_controller_step(
    epsilon_high: float, mean_entropy: float, target: float, delta: float, minimum: float, maximum: float
) -> float:
    """One update of ADAPO's controller (arXiv:2603.11682, §5.2).

    ``ε_high + δ`` if the mean entropy is below the target (allow more entropy increase), ``ε_high − δ`` if above
    (limit it), unchanged if equal; then clamped to ``[minimum, maximum]``.
    """
    epsilon_high = epsilon_high + entropy_direction(mean_entropy, target) * delta
    return min(max(epsilon_high, minimum), maximum)


class ADAPOController(EntropyTargetController):
    """Moves ε_high so that the mean full entropy tracks the target (measured on the first cycle unless given)."""

    name = "adapo"
    value_name = "epsilon_high"

    def __init__(
        self, epsilon_high: float, delta: float, minimum: float, maximum: float, entropy_target: float | None = None
    ):
        super().__init__(epsilon_high, entropy_target, bounds=(minimum, maximum))
        self.delta = float(delta)
        self.minimum = float(minimum)
        self.maximum = float(maximum)

    @property
    def epsilon_high(self) -> float:
        return self.value

    def step(self, value: float, mean_entropy: float, target: float) -> float:
        return adapo_controller_step(value, mean_entropy, target, self.delta, self.minimum, self.maximum)


class ADAPOPart(MethodPart):
    """ADAPO's seams: its controller, and the PPO clip's upper bound where the controller holds it."""

    key = "adapo"

    def controllers(self) -> list[Controller]:
        args = self.args
        return [
            ADAPOController(
                args.epsilon_high,
                args.adapo_epsilon_high_step,
                args.adapo_epsilon_high_min,
                args.adapo_epsilon_high_max,
                args.adapo_entropy_target,
            )
        ]

    def clip_range(self) -> tuple[float, float]:
        return self.trainer.epsilon_low, self.trainer.controllers[ADAPOController.name].value


@dataclass
class ADAPOConfig(EntropyGRPOBaseConfig):
    r"""
    Configuration for [`ADAPOTrainer`]: [`EntropyGRPOBaseConfig`] with the DAPO loss (default; any loss type
    with the PPO clip works) and an adaptive `epsilon_high`.

    Parameters:
        epsilon_high (`float`, *optional*, defaults to `0.28`):
            Initial ε_high (DAPO's value, paper). `epsilon` (ε_low, default 0.2) stays fixed.
        adapo_epsilon_high_step (`float`, *optional*, defaults to `0.01`):
            Controller step δ of ε_high per generation cycle (ours).
        adapo_epsilon_high_min (`float`, *optional*, defaults to `0.1`):
            Lower bound of ε_high (ours).
        adapo_epsilon_high_max (`float`, *optional*, defaults to `0.5`):
            Upper bound of ε_high (ours).
        adapo_entropy_target (`float` or `None`, *optional*, defaults to `None`):
            Target mean full entropy H* (nats per token). `None` measures it on the first generation cycle (paper).
    """

    # ADAPO moves the upper bound of the PPO clip (DAPO's clip-higher, arXiv:2603.11682, §5.2): any loss type with
    # that clip works (the paper's is DAPO, the default); see docs/loss_types.md.
    supported_loss_types: ClassVar[tuple[str, ...]] = PPO_CLIP_LOSS_TYPES
    unsupported_loss_type_reasons: ClassVar[dict[str, str]] = {
        "cispo": "CISPO has no PPO clip to move: its epsilon_high is epsilon_max, the cap of a detached importance "
        "weight (ScaleRL recommends 5.0), not DAPO's clip-higher that ADAPO adapts",
        "sapo": "SAPO has no clip bound to move: a smooth sigmoid gate replaces the clip",
        "vespo": "VESPO has no clip bound to move: a smooth gamma weight of the sequence ratio replaces the clip",
    }
    controls_clip_range: ClassVar[bool] = True  # ADAPO warns about on-policy training itself, in its own words

    method_parts: ClassVar[tuple[type, ...]] = (ADAPOPart,)

    epsilon_high: float | None = config_field(
        0.28,
        "Initial upper clip epsilon_high (DAPO's 0.28, paper); ADAPO moves it once per generation cycle. `epsilon` "
        "(epsilon_low) stays fixed.",
        valid=Range(0),
    )
    adapo_epsilon_high_step: float = config_field(
        0.01,
        "Step delta of epsilon_high per generation cycle (ours: the paper gives no value).",
        valid=Range(0, ends="(]"),
    )
    adapo_epsilon_high_min: float = config_field(
        0.1,
        "Lower bound of epsilon_high (ours: the paper's range did not survive extraction).",
        valid=Range(0),
    )
    adapo_epsilon_high_max: float = config_field(
        0.5,
        "Upper bound of epsilon_high (ours: the paper's range did not survive extraction).",
        valid=Range(),
    )
    adapo_entropy_target: float | None = config_field(
        None,
        "ADAPO's target mean full entropy H* (nats per token). None (default, paper) measures it on the first "
        "generation cycle.",
        **ENTROPY_TARGET,
    )

    def check_settings(self) -> None:
        reject_trl_entropy_bonus(self, "ADAPO")
        if self.adapo_epsilon_high_max < self.adapo_epsilon_high_min:
            raise ValueError(
                f"adapo_epsilon_high_max must be a finite number >= adapo_epsilon_high_min="
                f"{self.adapo_epsilon_high_min!r}, got {self.adapo_epsilon_high_max!r}."
            )
        if not self.adapo_epsilon_high_min <= self.epsilon_high <= self.adapo_epsilon_high_max:
            raise ValueError(
                f"epsilon_high (ADAPO's initial epsilon_high) must lie in [adapo_epsilon_high_min, "
                f"adapo_epsilon_high_max] = [{self.adapo_epsilon_high_min!r}, {self.adapo_epsilon_high_max!r}], "
                f"got {self.epsilon_high!r}."
            )
        if not (0 <= self.epsilon < 1):
            raise ValueError(f"epsilon (ADAPO's fixed epsilon_low) must lie in [0, 1), got {self.epsilon!r}.")
        warn_if_on_policy(
            self,
            "ADAPO",
            "every ratio is 1, so the clip never binds and epsilon_high, the value ADAPO controls, has no effect; the "
            "loss is plain DAPO.",
            "ADAPO to act",
        )


class ADAPOTrainer(EntropyGRPOTrainer):
    """DAPO (asymmetric clip, token-level loss normalisation) with ε_high moved by ADAPO's entropy controller.

    Takes the same arguments as `trl.GRPOTrainer`; `args` must be an [`ADAPOConfig`].
    """

    config_class = ADAPOConfig
    paper = Paper(
        "petrenko2026repo",
        "Entropy-Preserving Reinforcement Learning",
        "2603.11682",
        2026,
        "Petrenko and others",
        note="ICLR 2026",
    )
    _name = "ADAPO"
    _paper = method_paper(paper)
    _tag_names = model_card_tags("adapo")


SPEC = MethodSpec(
    key="adapo",
    config_class=ADAPOConfig,
    trainer_class=ADAPOTrainer,
    description="ADAPO: DAPO with an adaptive epsilon_high",
    acts_on=(Place.CLIP_RANGE,),
    needs_ppo_clip=True,
    metrics=(
        Metric("adapo/epsilon_high", "ADAPO: upper clip ε_high (adapo/epsilon_high)", "ε_high"),
        Metric("adapo/entropy_target", target_label="ADAPO target"),
    ),
    # The first step, before the controller moves ε_high, is DAPO's clip-higher.
    neutral=Neutral(trl={"epsilon_high": 0.28}),
    docs=MethodDocs(
        summary="DAPO with an adaptive upper clip `epsilon_high`",
        choose_when="DAPO with its upper clip steered by the entropy",
    ),
    exports=(ADAPOController,),
)
