"""vLLM as TRL's ``use_vllm=True`` drives it: the arguments checked before TRL builds an engine, and the one change the
CPU platform needs for TRL's colocate weight sync.

On the CPU platform, vLLM re-packs each linear and embedding weight for its CPU kernels once the checkpoint is loaded
(``dispatch_cpu_unquantized_gemm``, called by the unquantized linear and embedding methods' ``process_weights_after_
loading``). The linear layers' ``weight`` becomes an empty parameter without a ``weight_loader``, and the kernels keep
a packed copy. TRL's colocate sync pushes each new weight through the model's ``load_weights``, which then fails
(``'Parameter' object has no attribute 'weight_loader'``); the packed copies would be stale even where it did not.
While TRL builds the engine, :func:`plain_cpu_weights` has every 2-D weight kept as it is and multiplied by
``torch.nn.functional.linear``, the path vLLM itself takes for layers it does not pack, so every sync lands in the
weights the engine reads. Nothing changes where vLLM runs on another platform.

The vLLM internals this relies on are listed in :data:`VLLM_CPU_NAMES` and checked before the engine is built; once it
is built, :func:`check_plain_weights` confirms that no layer was packed. A vLLM release that changes either fails
loudly, naming its version and what changed.
"""

import contextlib
import inspect
from importlib.metadata import PackageNotFoundError, version

import torch
from trl.import_utils import is_vllm_available


VLLM_CPU_INSTALL = "docs/distributed.md, 'vLLM on a CPU'"

# name → (the parameters it is called with, what trl_entropy does with it)
VLLM_CPU_NAMES = {
    "vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm": (
        ("layer", "remove_weight"),
        "replaces while TRL builds a colocated engine, so that the weights stay unpacked for TRL's weight sync",
    ),
    "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend.get_supported_head_sizes": (
        (),
        "reads to refuse a model whose head size vLLM's CPU attention lacks, before the engine is built",
    ),
}


def vllm_version() -> str:
    try:
        return version("vllm-cpu")
    except PackageNotFoundError:
        return version("vllm")


def vllm_installed() -> bool:
    """Whether vLLM can be used: TRL's own answer."""
    return is_vllm_available()


def vllm_on_cpu() -> bool:
    """Whether the installed vLLM runs on the CPU platform (the ``vllm-cpu`` build, or a build with no GPU)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def resolve(name: str):
    """The object a dotted ``name`` of :data:`VLLM_CPU_NAMES` refers to, or a clear error naming what is missing."""
    import importlib

    parts = name.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            if not hasattr(target, attribute):
                raise RuntimeError(
                    f"vllm=={vllm_version()} has no {name}, which trl_entropy {VLLM_CPU_NAMES[name][1]}. Install the "
                    f"vLLM version trl_entropy is tested with ({VLLM_CPU_INSTALL})."
                )
            target = getattr(target, attribute)
        return target
    raise RuntimeError(f"vllm=={vllm_version()} has no module for {name}")


def check_vllm_cpu_names() -> None:
    """Every name of :data:`VLLM_CPU_NAMES` exists and takes the parameters trl_entropy passes."""
    for name, (parameters, use) in VLLM_CPU_NAMES.items():
        target = resolve(name)
        found = tuple(inspect.signature(target).parameters)[: len(parameters)]
        if found != parameters:
            raise RuntimeError(
                f"vllm=={vllm_version()}: {name} now takes {found}, but trl_entropy {use} with {parameters}. Install "
                f"the vLLM version trl_entropy is tested with ({VLLM_CPU_INSTALL})."
            )


def keep_plain_weight(layer: torch.nn.Module, remove_weight: bool, pack) -> None:
    """In place of vLLM's ``dispatch_cpu_unquantized_gemm``: a 2-D weight stays the parameter TRL's sync loads into,
    multiplied by ``torch.nn.functional.linear``; other weights (vLLM's MoE experts and convolutions) go to ``pack``,
    vLLM's own dispatch."""
    if layer.weight.ndim == 2:
        layer.cpu_linear = torch.nn.functional.linear
    else:
        pack(layer, remove_weight)


@contextlib.contextmanager
def plain_cpu_weights(enabled: bool):
    """While open, and ``enabled``, vLLM on the CPU platform keeps every linear and embedding weight unpacked (see the
    module docstring). Where vLLM runs on another platform, or ``enabled`` is False, it does nothing."""
    if not (enabled and vllm_on_cpu()):
        yield
        return
    check_vllm_cpu_names()
    import vllm.model_executor.layers.utils as layer_utils

    pack = layer_utils.dispatch_cpu_unquantized_gemm
    layer_utils.dispatch_cpu_unquantized_gemm = lambda layer, remove_weight: keep_plain_weight(
        layer, remove_weight, pack
    )
    try:
        yield
    finally:
        layer_utils.dispatch_cpu_unquantized_gemm = pack


def check_plain_weights(model: torch.nn.Module) -> None:
    """After the engine is built on the CPU platform: every layer vLLM dispatched to a CPU kernel multiplies its own,
    unpacked weight. Raises, naming the layers, when vLLM packed one anyway (a release that packs elsewhere)."""
    plain = torch.nn.functional.linear
    packed = [
        name
        for name, module in model.named_modules()
        if hasattr(module, "cpu_linear")
        and getattr(module, "weight", None) is not None
        and (module.weight.numel() == 0 or module.weight.ndim == 2 and module.cpu_linear is not plain)
    ]
    if packed:
        raise RuntimeError(
            f"vllm=={vllm_version()} packed the weights of {', '.join(packed[:5])}"
            f"{' and more' if len(packed) > 5 else ''} for its CPU kernels after trl_entropy asked it not to, so "
            f"TRL's weight sync would not reach them (trl_entropy/core/trl/vllm.py). Install the vLLM version "
            f"trl_entropy is tested with ({VLLM_CPU_INSTALL})."
        )


def text_config(model):
    """The text model's config of ``model`` (a model, or a name or path TRL loads)."""
    from transformers import AutoConfig

    config = model.config if hasattr(model, "config") else AutoConfig.from_pretrained(model)
    return config.get_text_config()


def check_vllm_arguments(args, model) -> None:
    """Refuse, before TRL loads anything, the ``use_vllm=True`` settings that cannot work, each error naming the field
    and the fix."""
    if not vllm_installed():
        raise ImportError(
            "use_vllm=True needs vLLM, which is not installed. With a GPU: pip install -e '.[vllm]'. Without one, "
            f"vLLM's CPU build in its own virtual environment ({VLLM_CPU_INSTALL}). Or set use_vllm=False to generate "
            "with transformers."
        )
    on_cpu = args.use_cpu or not torch.cuda.is_available()
    if args.vllm_mode == "server" and on_cpu:
        raise ValueError(
            "vllm_mode='server' cannot run on a CPU: TRL sends the weights to `trl vllm-serve` over NCCL, which "
            "needs a CUDA device in the trainer and in the server. Set vllm_mode='colocate' to run vLLM inside the "
            "training process."
        )
    config = text_config(model)
    if args.vllm_max_model_length is not None and args.vllm_max_model_length > config.max_position_embeddings:
        raise ValueError(
            f"vllm_max_model_length={args.vllm_max_model_length} is above the model's max_position_embeddings "
            f"({config.max_position_embeddings}). Set vllm_max_model_length to at most "
            f"{config.max_position_embeddings}, or leave it unset to use the model's."
        )
    if args.vllm_mode == "colocate" and vllm_on_cpu():
        supported = resolve("vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend.get_supported_head_sizes")()
        head_size = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        if head_size not in supported:
            raise ValueError(
                f"vLLM's CPU attention supports head sizes {supported}; this model's is {head_size} (hidden_size "
                f"{config.hidden_size} / num_attention_heads {config.num_attention_heads}). Use a model with a "
                "supported head size, or use_vllm=False to generate with transformers."
            )
