"""Clip-Cov: detach a few random high-covariance tokens from the policy loss (Cui et al., "The Entropy Mechanism of
Reinforcement Learning for Reasoning Language Models", arXiv:2505.22617, §4.2, eqs. 11–12; docs/clip_cov.md).

Among the valid tokens whose surrogate is not already flat (the PPO clip active; no token for CISPO, SAPO and VESPO,
whose surrogates keep every token's gradient: docs/loss_types.md) and whose covariance term ``Cov_t`` (eq. 10) lies in
``(lb, ub)``, ``n = max(⌊ρ·N_valid⌋, 1)`` are drawn at random; their policy loss (and gradient) becomes 0, and they
stay in the normaliser. Where the draw is made (per micro-batch, or once per generation batch) is the shared
``cov_selection_scope`` of ``methods/cov_selection.py``.
"""

import functools
import hashlib
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..core.batch import CompletionBatch
from ..core.checkpoint import load_rank_file, rank_file
from ..core.citation import method_paper, model_card_tags
from ..core.config import TOKEN_FRACTION, Range, config_field
from ..core.parts import Metrics, TokenGate, TokenMean
from ..core.statistics import token_covariance
from ..core.trainer import EntropyGRPOTrainer
from ..core.trl.surrogates import surrogate_flat
from ..core.warn import warn_user
from .cov_selection import COV_PAPER, PAPER, CovSelectionConfig, CovSelectionPart, selection_count
from .spec import MethodDocs, MethodSpec, Metric, Neutral, Place, Sweep


CLIP_COV_GENERATOR_FILE = "clip_cov_generator_{process_index}.pt"


def clip_cov_selection(
    cov: torch.Tensor,
    mask: torch.Tensor,
    clip_active: torch.Tensor,
    ratio: float,
    lb: float,
    ub: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """Clip-Cov's detached tokens: a uniformly random subset of the candidates, as a bool ``(B, T)`` tensor.

    Candidates are the valid tokens (``mask`` set) whose clip is not active and with ``lb < cov < ub``. The subset
    has ``n = max(⌊ratio · N_valid⌋, 1)`` of them (all of them if there are fewer), ``N_valid`` being the number of
    valid tokens. The choice is ``torch.randperm(num_candidates, generator=generator)[:n]`` over the candidates in
    row-major order, drawn on the generator's device; the generator is advanced only when a choice is actually made
    (more candidates than ``n``), so the same inputs and generator state always give the same subset.
    """
    valid = mask.bool()
    candidates = valid & ~clip_active.bool() & (cov > lb) & (cov < ub)
    selected = torch.zeros(valid.shape, dtype=torch.bool, device=valid.device)
    count = selection_count(ratio, int(valid.sum().item()))
    candidate_index = candidates.flatten().nonzero().squeeze(1)
    if candidate_index.numel() > count:
        order = torch.randperm(candidate_index.numel(), generator=generator, device=generator.device)
        candidate_index = candidate_index[order[:count].to(candidate_index.device)]
    selected.view(-1)[candidate_index] = True
    return selected


def generation_batch_seed(seed: int, step: int) -> int:
    """Seed of Clip-Cov's draw over the generation batch made at optimizer step ``step`` of a run seeded ``seed``.

    A fixed function of the two (the first 8 bytes of a SHA-256), so every rank draws the same tokens and a resumed
    run draws what the uninterrupted run drew, with no generator state to save.
    """
    digest = hashlib.sha256(f"clip_cov:{seed}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


class ClipCovPart(CovSelectionPart):
    """Clip-Cov's seam: a gate that zeroes the loss of the drawn tokens.

    ``cov_selection_scope="micro_batch"``: the random choice uses a CPU ``torch.Generator`` seeded with
    ``args.seed + process_index`` (one per rank, so each rank is reproducible and ranks draw differently), and a
    separate one, seeded alike, for evaluation so evaluating never shifts the training draws. The training generator's
    state is saved in every checkpoint (``clip_cov_generator_<rank>.pt``) and restored by ``resume_from_checkpoint``.

    ``cov_selection_scope="generation_batch"``: the draw over a training generation batch uses a generator seeded with
    :func:`generation_batch_seed` of ``args.seed`` and the optimizer step, the same on every rank and after a resume
    (so checkpoints hold no generator state). Evaluation draws from its own generator seeded with ``args.seed`` (the
    same on every rank). In the loss, a drawn token whose clip is active at that step is left as it is (its policy
    gradient is already zero): the draw is made before any ratio is known, where every ratio is 1.
    """

    key = "clip_cov"

    @functools.cached_property
    def generators(self) -> dict[str, torch.Generator]:
        """The draws' generators, ``"train"`` and ``"eval"``."""
        seed = self.args.seed
        if self.args.cov_selection_scope == "micro_batch":
            seed += self.trainer.accelerator.process_index
        return {mode: torch.Generator().manual_seed(seed) for mode in ("train", "eval")}

    def select_tokens(self, cov, mask, clip_active, mode):
        if self.args.cov_selection_scope == "generation_batch" and mode == "train":
            seed = generation_batch_seed(self.args.seed, self.trainer.state.global_step)
            generator = torch.Generator().manual_seed(seed)
        else:
            generator = self.generators[mode]
        args = self.args
        return clip_cov_selection(
            cov, mask, clip_active, args.clip_cov_ratio, args.clip_cov_lb, args.clip_cov_ub, generator
        )

    def gate(
        self, batch: CompletionBatch, ratio: torch.Tensor, token_advantages: torch.Tensor
    ) -> tuple[TokenGate, Metrics]:
        trainer = self.trainer
        epsilon_low, epsilon_high = trainer.clip_range()
        with torch.no_grad():
            delta = self.args.delta
            clip_active = surrogate_flat(trainer.loss_type, ratio, token_advantages, epsilon_low, epsilon_high, delta)
            clip_active = clip_active.expand_as(batch.log_probs)
            if self.args.cov_selection_scope == "micro_batch":
                cov = token_covariance(batch.log_probs, token_advantages, batch.mask)
                detached = self.select_tokens(cov, batch.mask, clip_active, batch.mode)
            else:
                detached = self.carried_selection(batch) & ~clip_active
        gate = TokenGate(weight=(~detached).to(batch.log_probs.dtype))
        return gate, {"clip_cov/detached_fraction": TokenMean(detached.float(), batch.mask)}

    def rank_checkpoint_state(self) -> dict[str, object]:
        # The generation-batch draws need no state: they are seeded by the step.
        if self.args.cov_selection_scope != "micro_batch":
            return {}
        return {CLIP_COV_GENERATOR_FILE: self.generators["train"].get_state()}

    def restore_rank_checkpoint_state(self, checkpoint: str) -> None:
        if self.args.cov_selection_scope != "micro_batch":
            return
        process_index = self.trainer.accelerator.process_index
        state = load_rank_file(checkpoint, CLIP_COV_GENERATOR_FILE, process_index)
        if state is None:
            path = rank_file(checkpoint, CLIP_COV_GENERATOR_FILE, process_index)
            warn_user(
                f"{path} is missing: Clip-Cov's token selection restarts from its seed instead of continuing the "
                "checkpointed random stream"
            )
            return
        self.generators["train"].set_state(state)


@dataclass
class ClipCovConfig(CovSelectionConfig):
    r"""
    Configuration for [`ClipCovTrainer`]: [`EntropyGRPOBaseConfig`] plus Clip-Cov's selection (Cui et al., "The Entropy
    Mechanism of Reinforcement Learning for Reasoning Language Models", arXiv:2505.22617, §4.2).

    The PPO clip range is GRPOConfig's `epsilon` (0.2, the paper's ε) and `epsilon_high`. All four loss types are
    supported; `importance_sampling_level` must be `"token"`.

    Parameters:
        clip_cov_ratio (`float`, *optional*, defaults to `2e-4`):
            ρ: the detached tokens number `max(floor(ρ · N_valid), 1)` per micro-batch (per generation batch with
            `cov_selection_scope="generation_batch"`). Paper §4.3.
        clip_cov_lb (`float`, *optional*, defaults to `1.0`):
            Lower bound of the candidates' covariance (exclusive). Paper §4.3.
        clip_cov_ub (`float`, *optional*, defaults to `5.0`):
            Upper bound of the candidates' covariance (exclusive). Paper §4.3.
        cov_selection_scope (`str`, *optional*, defaults to `"micro_batch"`):
            See [`CovSelectionConfig`].
    """

    method_parts: ClassVar[tuple[type, ...]] = (ClipCovPart,)

    clip_cov_ratio: float = config_field(
        2e-4,
        "ρ: fraction of the valid tokens to detach, max(floor(ρ·N_valid), 1) tokens drawn at random among the "
        "candidates, N_valid counted over the selection scope (micro-batch or generation batch). In (0, 1]. Default "
        f"from the paper ({PAPER}, §4.3) and verl.",
        **TOKEN_FRACTION,
    )
    # The bounds may be infinite: (−inf, inf) makes every token a candidate.
    clip_cov_lb: float = config_field(
        1.0,
        "Lower bound (exclusive) of a candidate's covariance (ℓ_t − ℓ̄)(A_t − Ā). Default from the paper "
        f"({PAPER}, §4.3) and verl.",
        valid=Range(finite=False),
    )
    clip_cov_ub: float = config_field(
        5.0,
        "Upper bound (exclusive) of a candidate's covariance; must exceed clip_cov_lb. Default from the "
        f"paper ({PAPER}, §4.3) and verl.",
        valid=Range(finite=False),
    )

    def check_settings(self) -> None:
        if not self.clip_cov_lb < self.clip_cov_ub:
            raise ValueError(
                "clip_cov_lb must be below clip_cov_ub (candidates lie strictly between them), got "
                f"clip_cov_lb={self.clip_cov_lb!r} and clip_cov_ub={self.clip_cov_ub!r}."
            )


class ClipCovTrainer(EntropyGRPOTrainer):
    """GRPO with Clip-Cov (Cui et al., arXiv:2505.22617, §4.2): a few random high-covariance tokens are detached from
    the policy loss (how they are drawn: :class:`ClipCovPart`)."""

    config_class = ClipCovConfig
    paper = COV_PAPER
    _name = "Clip-Cov"
    _paper = method_paper(paper)
    _tag_names = model_card_tags("clip-cov")


SPEC = MethodSpec(
    key="clip_cov",
    config_class=ClipCovConfig,
    trainer_class=ClipCovTrainer,
    description="Clip-Cov: detach high-covariance tokens",
    acts_on=(Place.GATES,),
    needs_ppo_clip=True,  # it draws among the tokens whose clip does not bind
    metrics=(
        Metric(
            "clip_cov/detached_fraction",
            "Clip-Cov: detached fraction (clip_cov/detached_fraction)",
            "fraction of tokens",
            smooth=True,
        ),
    ),
    neutral=Neutral(ours={"clip_cov_lb": 1e8, "clip_cov_ub": 1e9}),  # no candidate token: nothing detached
    docs=MethodDocs(
        summary="detaches a few tokens with high log-prob/advantage covariance",
        choose_when="a fixed-cost fix that touches only the few tokens driving the collapse, PPO's clip kept",
    ),
    # The toy sweep: the ratio over 0.01–0.5 and the lower bound of the covariance window.
    sweep=Sweep({"clip_cov_ratio": [0.01, 0.02, 0.05, 0.1, 0.2, 0.5], "clip_cov_lb": [0.05, 0.2, 1.0]}),
)
