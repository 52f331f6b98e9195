import ast
from pathlib import Path

from setuptools import find_packages, setup


ROOT = Path(__file__).parent


def read_assignment(path: Path, name: str) -> str:
    """The string a module assigns to ``name``, read from its text: setup.py runs before the dependencies are
    installed, so it cannot import the package."""
    for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
        names = [target.id for target in getattr(node, "targets", []) if isinstance(target, ast.Name)]
        if isinstance(node, ast.Assign) and names == [name]:
            return ast.literal_eval(node.value)
    raise RuntimeError(f"{path} assigns no {name} string")


TRL_REQUIREMENT = read_assignment(ROOT / "trl_entropy" / "core" / "trl" / "pin.py", "TRL_REQUIREMENT")
VERSION = read_assignment(ROOT / "trl_entropy" / "__init__.py", "__version__")  # written once, in the package

setup(
    name="trl-entropy",
    version=VERSION,
    # Names no method: the registry (trl_entropy/methods/__init__.py) and the README list them.
    description="Entropy-control trainers for Hugging Face TRL: drop-in replacements for trl.GRPOTrainer",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.11",  # TRL 1.16's own requirement
    packages=find_packages(include=["trl_entropy", "trl_entropy.*"]),
    # The demo's per-run YAML configs (trl_entropy/demo/models.py), so that an installed package runs the demo as a
    # clone does; the clone's examples/configs is a link to that folder.
    package_data={"trl_entropy.demo": ["configs/*.yaml", "configs/*/*.yaml"]},
    # Exactly what the library imports. Lower bounds: TRL 1.16's own (accelerate, datasets); torch 2.8 is the first
    # whose Triton (3.4) has `triton.knobs`, which the Triton backend uses. Triton itself is not declared: CUDA builds
    # of torch bring it, and on a CPU machine the PyTorch backend runs without it.
    install_requires=[
        "torch>=2.8",
        TRL_REQUIREMENT,
        # The trainers override private `transformers.Trainer` methods (`_save_checkpoint`,
        # `_load_optimizer_and_scheduler`), which a new major version may change.
        "transformers>=5.0,<6",
        "accelerate>=1.10.1",
        "datasets>=4.7",
        "tokenizers>=0.21",
        "packaging",
        # the kernel's threshold search (its per-row bookkeeping on the CPU), the evaluation and the report
        "numpy",
    ],
    extras_require={
        # LoRA (`peft_config`, `--use_peft`): only LoRA users need peft, and the library never imports it itself.
        "peft": ["peft>=0.17"],
        # DeepSpeed ZeRO-2/3; DeepSpeed needs einops and pydantic at import time without declaring them.
        "deepspeed": ["deepspeed>=0.18.6", "einops", "pydantic>=2"],
        # Liger's layer kernels (`use_liger_kernel=True`, on a GPU) and the kernel benchmark's Liger comparison.
        "liger": ["liger-kernel>=0.8.2"],
        "vllm": ["vllm"],
        # Drawing: `trl-entropy demo`'s PNG and `trl-entropy report` (trl_entropy/report/).
        "plot": ["matplotlib"],
        # `trl-entropy fetch-model` (trl_entropy/pretrained.py): reading a GGUF file to convert it, once; the converted
        # checkpoint loads without it. The lower bound is transformers' own for GGUF.
        "gguf": ["gguf>=0.10.0"],
        # Everything the tests use: the Triton interpreter tests, the ZeRO-3 and LoRA tests, the Liger comparison, the
        # real-model tests (which convert SmolLM2 with gguf).
        "dev": [
            "pytest>=8",
            "pytest-xdist",  # the test command on both cores (README)
            "build",
            "wheel",
            "matplotlib",
            "pyyaml",
            "triton>=3.4",
            "peft>=0.17",
            "deepspeed>=0.18.6",
            "einops",
            "pydantic>=2",
            "liger-kernel>=0.8.2",
            "gguf>=0.10.0",
        ],
    },
    # `trl-entropy train|report|demo|fetch-model ...` (trl_entropy/cli.py); report and demo draw with the plot extra,
    # fetch-model converts with the gguf extra.
    entry_points={"console_scripts": ["trl-entropy = trl_entropy.cli:main"]},
)
