"""The registry: every method's declaration, read from its module (one import line each), in the order `--method`,
the report and the docs list them; each name `--method` accepts; and the owners of each method field.
docs/adding_a_method.md says how to add a method."""

from ..core.config import EntropyGRPOBaseConfig
from ..core.trainer import EntropyGRPOTrainer
from .adapo import SPEC as _adapo
from .aent import SPEC as _aent
from .ce_gppo import SPEC as _ce_gppo
from .clip_cov import SPEC as _clip_cov
from .compose import owners_of_fields
from .ent_adv import SPEC as _ent_adv
from .entrocraft import SPEC as _entrocraft
from .entropic import SPEC as _entropic
from .erc import SPEC as _erc
from .kl_cov import SPEC as _kl_cov
from .qae import SPEC as _qae
from .repo import SPEC as _repo
from .siren import SPEC as _siren
from .spec import MethodDocs, MethodSpec, Metric, Neutral, Place, Sweep, Variant
from .steer import SPEC as _steer


# The base trainer's own settings, declared like a method so that --method, the report and the tests list them with
# the rest. EntReg is TRL's entropy bonus on the base; 1e-3 is a common coefficient for it (ours: the bonus has no
# paper default). With the same entropy_coef, trl.GRPOTrainer computes the same loss.
GRPO = MethodSpec(
    key="grpo",
    config_class=EntropyGRPOBaseConfig,
    trainer_class=EntropyGRPOTrainer,
    variants={
        "grpo": Variant(
            "GRPO, no entropy control",
            metrics=(),
            docs=MethodDocs(choose_when="plain GRPO, the baseline every method is compared with"),
        ),
        "entreg": Variant(
            "TRL's entropy bonus (entropy_coef)",
            {"entropy_coef": 1e-3},
            metrics=("entropy_coef",),
            docs=MethodDocs(choose_when="TRL's own fixed bonus, as a baseline"),
            neutral=Neutral(trl={"entropy_coef": 1e-3}),
            # The toy sweep: TRL's entropy bonus from ten times its registry value up.
            sweep=Sweep({"entropy_coef": [0.01, 0.03, 0.1]}),
        ),
    },
    acts_on=(Place.REGULARISER,),
    metrics=(Metric("entropy_coef", "TRL entropy coefficient (entropy_coef)", "coefficient"),),
    docs=MethodDocs(summary="exactly `trl.GRPOTrainer` with control off (TRL's own entropy bonus included)"),
)


# Every declaration, in the order --method, the report and the docs list them.
SPECS: tuple[MethodSpec, ...] = (
    GRPO,
    _aent,
    _clip_cov,
    _kl_cov,
    _repo,
    _adapo,
    _qae,
    _ent_adv,
    _ce_gppo,
    _erc,
    _entropic,
    _steer,
    _entrocraft,
    _siren,
)
# Every name --method accepts -> its entry (a method with variants has one entry per variant).
METHODS: dict[str, MethodSpec] = {name: entry for spec in SPECS for name, entry in spec.entries().items()}
# Each field a method's config adds to the base's -> the names of the methods whose config has it.
FIELD_OWNERS: dict[str, list[str]] = owners_of_fields(METHODS)
