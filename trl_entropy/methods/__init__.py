"""The methods, one file each, and their registry: what `--method` names in `examples/train.py` and the demo.

Each method file reads top to bottom: its math as pure functions, its controller, its config, its trainer (a small
class that fills the hooks of `trl_entropy.core.trainer.EntropyGRPOTrainer`). docs/adding_a_method.md says how to add
one.
"""

from dataclasses import dataclass, field

from ..core.config import EntropyGRPOConfig
from ..core.trainer import EntropyGRPOTrainer
from .adapo import ADAPOConfig, ADAPOTrainer
from .aent import AEntConfig, AEntTrainer
from .clip_cov import ClipCovConfig, ClipCovTrainer
from .kl_cov import KLCovConfig, KLCovTrainer
from .qae import QAEConfig, QAETrainer
from .repo import REPOConfig, REPOTrainer


__all__ = ["METHODS", "Method", "get_method"]


@dataclass(frozen=True)
class Method:
    """A trainer, its config, and the config defaults that make the method what it is."""

    description: str
    config_class: type
    trainer_class: type
    defaults: dict = field(default_factory=dict)


# EntReg is TRL's own entropy bonus on the base; 1e-3 is a common coefficient for it (ours: the bonus has no paper
# default). REPO-R and REPO-D are one trainer with two variants.
METHODS: dict[str, Method] = {
    "grpo": Method("GRPO, no entropy control", EntropyGRPOConfig, EntropyGRPOTrainer),
    "entreg": Method(
        "TRL's entropy bonus (entropy_coef)", EntropyGRPOConfig, EntropyGRPOTrainer, {"entropy_coef": 1e-3}
    ),
    "aent": Method("AEnt: clamped-entropy bonus, adaptive coefficient", AEntConfig, AEntTrainer),
    "clip_cov": Method("Clip-Cov: detach high-covariance tokens", ClipCovConfig, ClipCovTrainer),
    "kl_cov": Method("KL-Cov: KL penalty on high-covariance tokens", KLCovConfig, KLCovTrainer),
    "repo_r": Method("REPO-R: rescaled per-token advantages", REPOConfig, REPOTrainer, {"repo_variant": "R"}),
    "repo_d": Method("REPO-D: decorrelated per-token advantages", REPOConfig, REPOTrainer, {"repo_variant": "D"}),
    "adapo": Method("ADAPO: DAPO with an adaptive epsilon_high", ADAPOConfig, ADAPOTrainer),
    "qae": Method("QAE: the K-quantile of the group's rewards as the baseline", QAEConfig, QAETrainer),
}


def get_method(name: str) -> Method:
    """The registered method called ``name``; a ValueError lists the valid names otherwise."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {sorted(METHODS)}")
    return METHODS[name]
