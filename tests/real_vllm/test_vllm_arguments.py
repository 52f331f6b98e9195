"""``use_vllm=True`` settings that cannot work are refused before TRL loads anything, each naming the field and the
fix; the CPU platform's plain weights are guarded against vLLM drift and leave other platforms alone."""

import inspect

import pytest
import torch
from _support.distributed_run import make_trainer
from _support.vllm_engine import VLLM_MISSING, VLLM_OPTIONS

from trl_entropy.core.trl import vllm as vllm_support


pytest.importorskip("vllm", reason=VLLM_MISSING)
import vllm.model_executor.layers.utils as layer_utils  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402


def build(path, tmp_path, **overrides):
    return make_trainer("aent", path, str(tmp_path), **{**VLLM_OPTIONS, **overrides})


def test_the_toy_policys_head_size_is_refused_naming_the_supported_ones(toy_model_path, tmp_path):
    with pytest.raises(ValueError, match=r"CPU attention supports head sizes \[32, 64.*this model's is 16"):
        build(toy_model_path, tmp_path)


def test_server_mode_on_a_cpu_says_why_it_cannot_work(vllm_toy_path, tmp_path):
    with pytest.raises(ValueError, match=r"vllm_mode='server' cannot run on a CPU: .*NCCL.*vllm_mode='colocate'"):
        build(vllm_toy_path, tmp_path, vllm_mode="server")


def test_a_model_length_above_the_models_positions_names_both(vllm_toy_path, tmp_path):
    with pytest.raises(
        ValueError, match=r"vllm_max_model_length=128 is above the model's max_position_embeddings \(64"
    ):
        build(vllm_toy_path, tmp_path, vllm_max_model_length=128)


def test_the_cpu_build_runs_on_the_cpu_platform():
    assert current_platform.is_cpu() and vllm_support.vllm_on_cpu()


def test_while_trl_builds_the_engine_a_2d_weight_stays_plain_and_other_weights_go_to_vllm():
    packed = []
    pack = layer_utils.dispatch_cpu_unquantized_gemm
    with vllm_support.plain_cpu_weights(True):
        assert layer_utils.dispatch_cpu_unquantized_gemm is not pack
        linear, convolution = torch.nn.Linear(4, 3), torch.nn.Conv1d(2, 2, 3)
        vllm_support.keep_plain_weight(linear, True, lambda layer, remove: packed.append(layer))
        vllm_support.keep_plain_weight(convolution, True, lambda layer, remove: packed.append(layer))
    assert layer_utils.dispatch_cpu_unquantized_gemm is pack  # restored once TRL's set-up is done
    assert linear.cpu_linear is torch.nn.functional.linear and linear.weight.shape == (3, 4)
    assert packed == [convolution]


def test_nothing_changes_off_the_cpu_platform(monkeypatch):
    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)
    pack = layer_utils.dispatch_cpu_unquantized_gemm
    with vllm_support.plain_cpu_weights(True):
        assert layer_utils.dispatch_cpu_unquantized_gemm is pack


def test_nothing_changes_when_vllm_is_not_colocated():
    pack = layer_utils.dispatch_cpu_unquantized_gemm
    with vllm_support.plain_cpu_weights(False):
        assert layer_utils.dispatch_cpu_unquantized_gemm is pack


def test_every_vllm_name_the_fix_relies_on_exists_with_its_parameters():
    vllm_support.check_vllm_cpu_names()
    for name, (parameters, _) in vllm_support.VLLM_CPU_NAMES.items():
        found = tuple(inspect.signature(vllm_support.resolve(name)).parameters)
        assert found[: len(parameters)] == parameters, name


def test_a_vllm_release_without_the_dispatch_fails_loudly_naming_it(monkeypatch):
    monkeypatch.delattr(layer_utils, "dispatch_cpu_unquantized_gemm")
    with pytest.raises(RuntimeError, match=r"vllm==[\d.]+ has no vllm\.model_executor\.layers\.utils\.dispatch_cpu"):
        vllm_support.check_vllm_cpu_names()


def test_a_vllm_release_with_other_dispatch_parameters_fails_loudly_naming_them(monkeypatch):
    monkeypatch.setattr(layer_utils, "dispatch_cpu_unquantized_gemm", lambda module, pack_now: None)
    with pytest.raises(RuntimeError, match=r"now takes \('module', 'pack_now'\).*\('layer', 'remove_weight'\)"):
        vllm_support.check_vllm_cpu_names()


def test_a_packed_layer_after_loading_is_named():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    for layer in model:
        layer.cpu_linear = torch.nn.functional.linear
    vllm_support.check_plain_weights(model)
    model[1].cpu_linear = lambda x, weight, bias: x  # vLLM's packed kernel
    model[1].weight = torch.nn.Parameter(torch.empty(0, 4))
    with pytest.raises(RuntimeError, match=r"packed the weights of 1 for its CPU kernels"):
        vllm_support.check_plain_weights(model)
