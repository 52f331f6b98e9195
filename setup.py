from pathlib import Path

from setuptools import setup


ROOT = Path(__file__).parent

# TRL's GRPOTrainer internals (loss step, fused LM head, metric dict) are what the trainers build on. They change
# between minor releases, so the supported range is narrow and checked again at import (trl_entropy/_compat.py).
TRL_REQUIREMENT = "trl>=1.16.0,<1.17"

setup(
    name="trl-entropy",
    version="0.1.0",
    description="Entropy-control trainers (AEnt, Clip-Cov, KL-Cov, REPO, ADAPO) for Hugging Face TRL",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    # `kernels/` ships as `trl_entropy.kernels`, never as a top-level `kernels` module: that name belongs to the
    # Hugging Face `kernels` package, which transformers imports when it is installed.
    packages=["trl_entropy", "trl_entropy.kernels"],
    package_dir={"trl_entropy": "trl_entropy", "trl_entropy.kernels": "kernels"},
    install_requires=[
        "torch>=2.4",
        TRL_REQUIREMENT,
        "transformers>=5.0",
        "peft>=0.17",
        "accelerate>=1.4",
        "datasets>=3.0",
        "liger-kernel>=0.6",
        "tokenizers>=0.21",
    ],
    extras_require={
        "vllm": ["vllm"],
        "dev": ["pytest>=8", "build", "wheel", "matplotlib", "pyyaml"],
    },
)
