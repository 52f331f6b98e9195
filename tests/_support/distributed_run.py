"""A short toy training run of one or more trainers, written for ``accelerate launch`` and for a plain process.

    accelerate launch --multi_gpu --num_processes 2 tests/_support/distributed_run.py \
        --model PATH --out DIR --methods aent
    accelerate launch --use_deepspeed --deepspeed_config_file tests/_support/zero3_cpu.json --num_processes 2 \
        tests/_support/distributed_run.py --model PATH --out DIR --methods aent,grpo
    accelerate launch --multi_gpu --num_processes 2 tests/_support/distributed_run.py --fsdp2 --model PATH --out DIR
    python tests/_support/distributed_run.py --model PATH --out DIR --methods aent,adapo --per-device-batch-size 8
    # on a GPU, with vLLM:
    python tests/_support/distributed_run.py --model DIR/toy --out DIR --methods all --vllm colocate --steps 5

(On the CPU: ``CUDA_VISIBLE_DEVICES=""``, and ``DS_ACCELERATOR=cpu`` for DeepSpeed; docs/distributed.md has the full
commands.) Completions come from :func:`deterministic_rollout` (TRL's ``rollout_func`` hook), a fixed function of the
prompt and of its copy index inside the group, so a run on two processes and a run on one process with the same global
batch see the same completions and rewards; everything downstream (scoring, advantages, loss, gradient reduction,
controller statistics and updates) is the trainers' own. ``--methods`` takes the registry's names and ``trl`` for
``trl.GRPOTrainer`` itself. Every rank writes ``<method>_rank<k>.json`` (per optimizer step the controller value it
holds, the logged loss and entropy; how the model was sharded, read inside the run) and ``<method>_rank<k>.pt`` (the
full final weights, gathered from the shards).

The tests import :func:`deterministic_rollout`, :func:`make_trainer` and :class:`ControllerRecorder` from here too.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
import zlib
from collections import Counter
from pathlib import Path
from types import SimpleNamespace


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from _support.bound_to_parent import PARENT_PID  # noqa: E402
from _support.grpo import toy_config  # noqa: E402
from _support.process import lighten  # noqa: E402
from _support.rounding import ControllerBounds, check, check_per_update  # noqa: E402
from _support.watchdog import WATCHED_ENV, Watchdog  # noqa: E402
from trl_entropy.methods import METHODS  # noqa: E402


def default_controllers(method) -> list:
    """The controllers ``method``'s parts build under its registry settings (a part may build one only under some)."""
    with warnings.catch_warnings():  # the on-policy warnings of the default layout: no training follows here
        warnings.simplefilter("ignore")
        args = toy_config(method.config_class, **method.defaults)
    trainer = SimpleNamespace(args=args, num_iterations=args.num_iterations)
    return [controller for part in args.method_parts for controller in part(trainer).controllers()]


# The methods with a controller: their parts build controllers under their registry settings, the base builds none.
ADAPTIVE_METHODS = tuple(name for name, method in METHODS.items() if default_controllers(method))
# The methods that read the rollout policy's entropy: they act only off-policy (where the rollout policy differs from
# the one being trained), so their runs here take two updates per generation batch.
ROLLOUT_ENTROPY_METHODS = tuple(
    name for name, m in METHODS.items() if any(part.needs_rollout_entropy for part in m.config_class.method_parts)
)
GROUP_SIZE = 4  # num_generations of every trainer make_trainer builds
# Completion length (characters before <eos>) of the k-th copy of a prompt: unequal inside a group, equal across
# groups, so every group, hence every rank's half of the batch, holds the same number of completion tokens.
COPY_LENGTHS = (2, 5, 3, 4)


def rollout_text(prompt: str, copy: int, lengths: tuple[int, ...] = COPY_LENGTHS) -> str:
    """The completion of copy ``copy`` of a toy prompt ``"a+b="``: right or off by one, padded to a fixed width."""
    a, b = (int(x) for x in prompt.rstrip("=").split("+"))
    correct = (zlib.crc32(f"{prompt}|{copy}".encode()) % 3) != 0  # deterministic, unlike hash()
    answer = str(a + b if correct else a + b + 1)
    return answer.rjust(lengths[copy % len(lengths)])  # toy_reward strips the spaces


def make_rollout(lengths: tuple[int, ...] = COPY_LENGTHS, eos: bool = True):
    """A TRL ``rollout_func`` whose completions depend only on the prompt and its copy index: no sampling.

    ``lengths[k]`` is the width of copy ``k``'s answer; ``eos=False`` leaves the ``<eos>`` out (truncated completions).
    """

    def rollout(prompts: list, trainer) -> dict:
        tokenizer = trainer.processing_class
        seen = Counter()
        prompt_ids, completion_ids = [], []
        for prompt in prompts:
            text = rollout_text(prompt, seen[prompt], lengths)
            seen[prompt] += 1
            prompt_ids.append(tokenizer(prompt, add_special_tokens=False)["input_ids"])
            tail = [tokenizer.eos_token_id] if eos else []
            completion_ids.append(tokenizer(text, add_special_tokens=False)["input_ids"] + tail)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    return rollout


deterministic_rollout = make_rollout()


def ranked_reward(completions: list, answer: list[str], **kwargs) -> list[float]:
    """The toy reward plus the completion's place in its group of ``GROUP_SIZE`` (0, 0.1, 0.2, ...).

    A group's rewards then differ whatever the policy samples, so every step has non-zero advantages and a loss of
    its own: tests whose completions are sampled use it for preconditions that must not depend on which tokens a CPU's
    numerics lead the policy to. Each rank scores a whole number of groups (TRL hands every rank consecutive slices
    of the generation batch), so the place in the local list is the place in the group.
    """
    if len(completions) % GROUP_SIZE:
        raise ValueError(f"ranked_reward needs whole groups of {GROUP_SIZE}, got {len(completions)} completions")
    from trl_entropy.toy import toy_reward

    correct = toy_reward(completions, answer)
    return [value + 0.1 * (index % GROUP_SIZE) for index, value in enumerate(correct)]


def controller_value(trainer) -> float | tuple[float, ...] | None:
    """The controller's value (AEnt λ, REPO β, ADAPO ε_high), each controller's of methods combined, or None for a
    method without a controller."""
    controllers = getattr(trainer, "controllers", None)  # trl.GRPOTrainer has none
    if not controllers:
        return None
    values = tuple(float(controller.value) for controller in controllers.values())
    return values[0] if len(values) == 1 else values


class ControllerRecorder(TrainerCallback):
    """Records, after every optimizer step, the controller value this rank holds, and each statistic every controller
    received (``statistics``: ``{controller name: [the statistic of each update]}``, in the controllers' order);
    ``moved_by_method`` names the controllers their method moves at every micro-batch."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.values: list[float | None] = []
        self.statistics: dict[str, list[float]] = {}
        controllers = getattr(trainer, "controllers", None) or {}
        self.moved_by_method = [name for name, c in controllers.items() if c.cadence == "micro_batch"]
        for name, controller in controllers.items():
            self.statistics[name] = []
            controller.update = self.recording(controller.update, self.statistics[name])

    @staticmethod
    def recording(update, received: list[float]):
        def recording_update(mean_statistic: float, step: int) -> None:
            received.append(float(mean_statistic))
            update(mean_statistic, step)

        return recording_update

    @classmethod
    def attached_to(cls, trainer) -> "ControllerRecorder":
        """A recorder of ``trainer``'s controller, added to its callbacks."""
        recorder = cls(trainer)
        trainer.add_callback(recorder)
        return recorder

    def on_step_end(self, args, state, control, **kwargs):
        self.values.append(controller_value(self.trainer))


# `--methods` name of `trl.GRPOTrainer` itself, the reference for the base with control off ("grpo").
TRL_REFERENCE = "trl"


def method_options(method: str) -> dict:
    """Config options that make the controller move visibly within a few toy steps (for methods combined, each
    method's)."""
    if method == TRL_REFERENCE:
        return {}
    from trl_entropy.methods import get_method
    from trl_entropy.methods.compose import SEPARATOR

    if SEPARATOR in method:  # the combination's own defaults (entropy_control among them), then each method's
        parts = {key: value for part in method.split(SEPARATOR) for key, value in method_options(part).items()}
        return {**get_method(method).defaults, **parts}

    options = dict(get_method(method).defaults) | get_method(method).short_run_settings
    if method in ROLLOUT_ENTROPY_METHODS:
        options.update(num_iterations=2)  # H^old ≠ H on the second update: the rollout entropy matters
    if method == "clip_cov":
        # Every valid token a candidate, a tenth of them detached: the random draw happens on every micro-batch.
        options.update(clip_cov_ratio=0.1, clip_cov_lb=-10.0, clip_cov_ub=10.0)
    if method == "kl_cov":
        options.update(num_iterations=2)  # two updates per rollout: ℓ^old ≠ ℓ on the second, so the penalty acts
    if method == "aent":
        # A band above the toy's entropy and a large α: λ rises by a different amount every step.
        options.update(aent_entropy_low=3.0, aent_entropy_high=4.0, aent_coef_lr=1e-3, aent_coef_max=1.0)
    if method == "entropic":
        # The toy's target (examples/configs/entropic.yaml). With the LLM default 0.1, α ≈ 0.74 and one weight of the
        # first layer gets a step-1 gradient of 5e-9, under Adam's ε: its update is then rounding, which two processes
        # and one round differently (1.2e-4 apart after three steps, with the losses equal to 1e-7).
        options.update(entropic_target=0.5)
    return options


def make_trainer(
    method: str,
    model,
    output_dir: str,
    rollout=deterministic_rollout,
    dataset_size=16,
    trainer_kwargs=None,
    reward=None,
    train_dataset=None,
    trainer_class=None,
    config_class=None,
    **overrides,
):
    """A trainer of the registered ``method`` (or ``"trl"``: ``trl.GRPOTrainer``) on the toy task (fp32, CPU, no
    reporting).

    ``overrides`` are config fields; ``trainer_kwargs`` go to the trainer (``peft_config``, ...). ``rollout=None``
    samples completions from the policy as usual; ``reward`` replaces ``toy_reward`` (e.g. :func:`ranked_reward`),
    ``train_dataset`` the toy task's ``dataset_size`` problems, ``trainer_class`` the method's (a subclass of it that
    records something), ``config_class`` the method's (``EntropyGRPOConfig``, with ``entropy_control``).
    """
    from _support.grpo import method_classes, toy_config, toy_dataset, toy_trainer
    from _support.parity import TRL

    method_trainer_class, method_config_class = method_classes(TRL if method == TRL_REFERENCE else method)
    options = dict(
        per_device_train_batch_size=8,
        num_generations=GROUP_SIZE,
        max_completion_length=8,
        learning_rate=1e-3,
        max_steps=3,
        logging_steps=1,
        save_strategy="no",
        seed=0,
    )
    options.update(method_options(method))
    options.update(overrides)
    return toy_trainer(
        trainer_class or method_trainer_class,
        toy_config(config_class or method_config_class, output_dir, **options),
        model,
        reward_funcs=reward,
        train_dataset=toy_dataset(dataset_size) if train_dataset is None else train_dataset,
        **{"rollout_func": rollout, **(trainer_kwargs or {})},
    )


def logged(trainer, key: str) -> list[float]:
    return [entry[key] for entry in trainer.state.log_history if key in entry and "train_runtime" not in entry]


def method_metrics(trainer, method: str) -> dict[str, list[float]]:
    """The logged values of every metric the registered ``method`` declares."""
    from trl_entropy.methods import get_method

    return {metric.key: logged(trainer, metric.key) for metric in get_method(method).metrics}


VLLM_OPTIONS = dict(
    rollout=None,  # vLLM samples
    use_cpu=False,
    bf16=True,
    use_vllm=True,
    vllm_gpu_memory_utilization=0.25,
    vllm_max_model_length=64,
)
VLLM_METRICS = ("sampling/importance_sampling_ratio/mean", "sampling/sampling_logp_difference/mean")


def save_vllm_toy_policy(path: str) -> None:
    """The toy policy for the vLLM smoke test: head size 64 (vLLM's attention kernels want a common head size), warm
    started on the toy task, saved in bfloat16."""
    from trl_entropy.toy import build_toy_model, build_toy_tokenizer, warm_start

    tokenizer = build_toy_tokenizer()
    model = build_toy_model(
        tokenizer, hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=2
    )
    warm_start(model, tokenizer)
    model.to(torch.bfloat16).save_pretrained(path)
    tokenizer.save_pretrained(path)


# ---------------------------------------------------------------------------------------------------------------------
# Sharded runs (DeepSpeed ZeRO-3 through accelerate, FSDP2 applied here), each checked from inside the run
# ---------------------------------------------------------------------------------------------------------------------


def fully_shard_model(path: str):
    """The policy at ``path`` sharded with FSDP2 over all processes: each decoder layer, the LM head as its own unit,
    then the root. With tied embeddings the head's unit holds the input embedding too (a parameter has one unit).

    accelerate on the CPU turns an FSDP config into plain DDP (``MULTI_CPU``), so the sharding is applied here, and the
    model is marked as prepared: accelerate then leaves it as it is (its DDP wrapper rejects DTensor parameters).
    """
    from accelerate import PartialState
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    mesh = init_device_mesh("cpu", (PartialState(cpu=True).num_processes,))  # starts the process group (gloo)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    head = model.get_output_embeddings()
    fully_shard([model.get_input_embeddings(), head] if model.config.tie_word_embeddings else head, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model._is_accelerate_prepared = True
    return model


def describe_parameter(parameter) -> dict:
    """How this rank holds a parameter: a plain tensor, an FSDP2 DTensor shard, or a DeepSpeed ZeRO-3 partition."""
    from torch.distributed.tensor import DTensor

    if isinstance(parameter, DTensor):
        return {
            "kind": "dtensor",
            "placements": [str(placement) for placement in parameter.placements],
            "mesh_size": parameter.device_mesh.size(),
            "numel": parameter.numel(),
            "local_numel": parameter.to_local().numel(),
        }
    if hasattr(parameter, "ds_id"):
        return {
            "kind": "zero3",
            "status": parameter.ds_status.name,
            "numel": parameter.ds_numel,
            "local_numel": parameter.numel(),  # 0 while partitioned
            "partition_numel": parameter.ds_tensor.numel(),
        }
    return {"kind": "tensor", "numel": parameter.numel(), "local_numel": parameter.numel()}


def head_weight(model):
    """The LM-head weight, read without side effects: inside a forward, DeepSpeed ZeRO-3 gathers a partitioned
    parameter on attribute access (``module.weight``), but not when it is listed."""
    return dict(model.get_output_embeddings().named_parameters(recurse=False))["weight"]


def record_head_weight_reads(model) -> list[dict]:
    """Describes the LM-head weight each time the backbone's forward returns: what the entropy head finds when it
    reads it, inside the root module's forward (after the root's own gather, without the head module's)."""
    reads = []

    def record(module, args, output):
        reads.append(describe_parameter(head_weight(model)))

    model.get_decoder().register_forward_hook(record)
    return reads


def sharding_record(trainer) -> dict:
    """What ran, read from the trainer after training: the distributed type, the ZeRO stage, which parameters are
    sharded on this rank, and whether the head's weight is still the input embedding's."""
    state = trainer.accelerator.state
    model = trainer.model
    described = {name: describe_parameter(p) for name, p in model.named_parameters()}
    return {
        "distributed_type": str(state.distributed_type.value),
        "zero_stage": state.deepspeed_plugin.zero_stage if state.deepspeed_plugin is not None else None,
        "parameters": len(described),
        "sharded_parameters": sorted(
            name
            for name, info in described.items()
            if info["kind"] != "tensor" and info["local_numel"] < info["numel"]
        ),
        "lm_head": describe_parameter(head_weight(model)),
        "tied": head_weight(model) is dict(model.get_input_embeddings().named_parameters())["weight"],
    }


def full_weights(model) -> dict[str, torch.Tensor]:
    """Every parameter, whole, in float64 (a collective under sharding: every rank makes the call)."""
    from torch.distributed.tensor import DTensor

    named = dict(model.named_parameters())
    if any(hasattr(p, "ds_id") for p in named.values()):
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(named.values())):
            return {name: p.detach().double().clone() for name, p in named.items()}
    return {
        name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().double().clone() for name, p in named.items()
    }


def save_untied_copy(path: str, target: str) -> None:
    """Save the policy at ``path`` with its LM head untied from the input embedding (a copy of it, trained apart)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tied = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    config = AutoConfig.from_pretrained(path, tie_word_embeddings=False)
    untied = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = tied.state_dict()
    state["lm_head.weight"] = tied.get_input_embeddings().weight.detach().clone()
    untied.load_state_dict(state)
    untied.save_pretrained(target)
    AutoTokenizer.from_pretrained(path).save_pretrained(target)


def run(
    method: str,
    model: str,
    out: str,
    per_device_batch_size: int,
    steps: int,
    vllm_mode: str | None = None,
    fsdp2: bool = False,
):
    from accelerate.utils import parse_flag_from_env

    overrides = dict(per_device_train_batch_size=per_device_batch_size, max_steps=steps)
    if vllm_mode is not None:
        overrides.update(VLLM_OPTIONS, vllm_mode=vllm_mode)
    if parse_flag_from_env("ACCELERATE_USE_DEEPSPEED"):
        # accelerate drops DeepSpeed under `use_cpu`; without it and without a GPU, only a named backend starts the
        # process group. DS_ACCELERATOR=cpu keeps DeepSpeed on the CPU.
        overrides.update(use_cpu=False, ddp_backend="gloo")
    if fsdp2:
        model = fully_shard_model(model)
    trainer = make_trainer(method, model, os.path.join(out, method), **overrides)
    recorder = ControllerRecorder.attached_to(trainer)
    head_weight_reads = record_head_weight_reads(trainer.model)
    trainer.train()
    rank = trainer.accelerator.process_index
    record = {
        "method": method,
        "num_processes": trainer.accelerator.num_processes,
        "rank": rank,
        "controller": recorder.values,
        "statistics": recorder.statistics,
        "moved_by_method": recorder.moved_by_method,
        "loss": logged(trainer, "loss"),
        "entropy": logged(trainer, "entropy"),
        "reward": logged(trainer, "reward"),
        # every metric the method declares (e.g. how many tokens its gate kept), per logged step
        "method_metrics": {} if method == TRL_REFERENCE else method_metrics(trainer, method),
        "sharding": sharding_record(trainer),
        "head_weight_reads": head_weight_reads,
    }
    if vllm_mode is not None:
        record.update({key: logged(trainer, key) for key in VLLM_METRICS})
        record["train_runtime"] = trainer.state.log_history[-1].get("train_runtime")
    weights = full_weights(trainer.model)
    os.makedirs(out, exist_ok=True)
    torch.save(weights, os.path.join(out, f"{method}_rank{rank}.pt"))
    with open(os.path.join(out, f"{method}_rank{rank}.json"), "w") as file:
        json.dump(record, file)
    trainer.accelerator.wait_for_everyone()


def checkout_package_path(folder) -> str:
    """A folder holding only a link to the ``trl_entropy`` this process imports (this checkout), to put first on a
    child's ``PYTHONPATH``: an installed copy elsewhere must not be picked up, and the repository root itself cannot
    go there (its ``kernels`` folder)."""
    import trl_entropy

    link_folder = Path(folder) / "checkout_package"
    link_folder.mkdir(parents=True, exist_ok=True)
    link = link_folder / "trl_entropy"
    if not link.exists():
        link.symlink_to(os.path.dirname(os.path.abspath(trl_entropy.__file__)), target_is_directory=True)
    return str(link_folder)


def launch_two_processes(script, script_options, folder: Path, launcher_options=("--multi_gpu",), **env):
    """Start ``script`` on two local processes with ``accelerate launch``; its log goes to ``folder/launch.log``.

    ``--multi_gpu`` with no visible CUDA device starts the processes with torchrun, each on the CPU with gloo. The
    launch runs from ``folder``: accelerate puts the working directory on DeepSpeed ranks' ``PYTHONPATH``, and the
    repository root holds a folder named ``kernels`` that transformers would take for the Hugging Face package.
    The launcher and the ranks are bound to their parents (``bound_to_parent.py``): the launch ends with this process.
    """
    here = os.path.dirname(
        os.path.dirname(os.path.abspath(__file__))
    )  # tests/: _support and _reference import from there
    environment = dict(
        os.environ,
        CUDA_VISIBLE_DEVICES="",  # the CPU even where a GPU exists: `--multi_gpu` only selects torchrun's launcher
        OMP_NUM_THREADS="1",
        TRL_EXPERIMENTAL_SILENCE="1",
        PYTHONPATH=os.pathsep.join(filter(None, [checkout_package_path(folder), here, os.environ.get("PYTHONPATH")])),
        **WATCHED_ENV,
        **env,
    )
    environment[PARENT_PID] = str(os.getpid())  # the launcher's parent, which it is bound to
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    bound = str(Path(here) / "_support" / "bound_to_parent.py")
    command = [sys.executable, bound, "-m", "accelerate.commands.launch", *launcher_options, "--num_processes", "2"]
    command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    command += ["--main_process_port", str(port), bound, str(script), *script_options]
    with open(Path(folder) / "launch.log", "w") as log:
        return subprocess.Popen(
            command, env=environment, cwd=folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


# A rank script prints this (with its rank) once its work is done and written, right before it tears down.
RANK_DONE = "trl_entropy rank finished:"


def end_rank_cleanly(rank: int) -> None:
    """The end of a rank script: say the work is done, then leave the process group and flush, so that the process
    exits without a teardown crash (a rank aborting in its destructors after the work was done)."""
    import torch.distributed as dist

    print(f"{RANK_DONE} {rank}", flush=True)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()


class TeardownCrash(AssertionError):
    """Every rank finished its work and wrote its record, and then a process crashed on its way out."""


def finish(launched: subprocess.Popen, folder: Path) -> None:
    """Wait for a launch; on failure or a hung rank (``_support/watchdog.py``), stop the launcher and both ranks and
    show the log's tail. A failure after every rank reported its work done is raised as a :class:`TeardownCrash`, with
    the log."""
    log_path = Path(folder) / "launch.log"
    watchdog = Watchdog(f"the launch in {folder}", [launched.pid], [log_path], count_roots=False)
    try:
        while launched.poll() is None:
            watchdog.check()
            time.sleep(0.05)
    finally:
        if launched.poll() is None:
            os.killpg(launched.pid, signal.SIGKILL)
            launched.wait()
    log = log_path.read_text()
    if launched.returncode != 0 and all(f"{RANK_DONE} {rank}" in log for rank in (0, 1)):
        raise TeardownCrash(
            f"both ranks finished and wrote their records, then the launch exited with {launched.returncode} while "
            f"tearing down (a crash at process exit, not a wrong result); the log:\n{log[-6000:]}"
        )
    assert launched.returncode == 0, log[-6000:]


def read_record(folder, method: str, rank: int = 0) -> tuple[dict, dict]:
    """``(record, full_weights)`` that ``rank`` wrote for ``method`` (:func:`run`)."""
    with open(os.path.join(folder, f"{method}_rank{rank}.json")) as file:
        record = json.load(file)
    return record, torch.load(os.path.join(folder, f"{method}_rank{rank}.pt"))


def controller_steps(record) -> list[tuple[float, ...]]:
    """The controller values after each step, as tuples (one value per controller of the run)."""
    return [tuple(value) if isinstance(value, list) else (value,) for value in record["controller"]]


def check_controllers(kind: str, method: str, two: dict, one: dict, bounds: ControllerBounds) -> None:
    """Two records' controllers, each on its own: the statistic it received at every update within
    ``bounds.statistic``, and its value after ``k`` updates within ``k`` times its per-update bound
    (``bounds.moved_by_method`` for a controller its method moves at every micro-batch, ``bounds.cycle`` for the
    others). ``kind`` and ``method`` name the comparisons."""
    names = list(one["statistics"])
    assert list(two["statistics"]) == names and names, "no controller recorded"
    for index, name in enumerate(names):
        received, expected = two["statistics"][name], one["statistics"][name]
        assert len(expected) == len(one["controller"]), "one update per step"
        for update, (two_value, one_value) in enumerate(zip(received, expected, strict=True)):
            check(f"{kind} statistic[{name}] #{update + 1}", two_value, one_value, bounds.statistic)
        per_update = bounds.moved_by_method if name in one["moved_by_method"] else bounds.cycle
        values = [[step[index] for step in controller_steps(record)] for record in (two, one)]
        check_per_update(f"{kind} controller[{method}:{name}]", *values, per_update)


def paired_weights(first: dict, second: dict) -> tuple[list, list]:
    """The two runs' weights, each in name order, for ``rounding.check``."""
    assert first.keys() == second.keys()
    names = sorted(first)
    return [first[name] for name in names], [second[name] for name in names]


def beside_two_processes(job, two, one, methods, run_one_process) -> dict:
    """Run each of ``methods`` on one process into ``one`` (``run_one_process(method)``) while the two ranks run
    ``job`` (``_support/rank_pool.py``), writing into ``two``; wait for them, and read both:
    ``{method: (one_process_record, [rank0_record, rank1_record])}``, each ``(record, full_weights)``."""
    try:
        for method in methods:
            run_one_process(method)
    finally:
        job.wait()
    return {
        method: (read_record(one, method), [read_record(two, method, rank) for rank in (0, 1)]) for method in methods
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        required=True,
        nargs="+",
        help="path of a saved toy policy; with several, each one's records go to a sub-folder of --out named after it",
    )
    parser.add_argument("--out", required=True, help="folder for the per-rank records")
    parser.add_argument(
        "--methods",
        default=",".join(ADAPTIVE_METHODS),
        help=f"comma-separated registry names and {TRL_REFERENCE!r} (trl.GRPOTrainer), or 'all' (the registry)",
    )
    parser.add_argument("--per-device-batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--vllm",
        choices=["colocate", "server"],
        default=None,
        help="GPU smoke test: generate with vLLM in this mode (sampled completions, bf16 on CUDA). A missing --model "
        "folder is filled with a vLLM-friendly toy policy first.",
    )
    parser.add_argument(
        "--fsdp2",
        action="store_true",
        help="shard the policy with FSDP2 (each decoder layer, the LM head as its own unit, the root) before training",
    )
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    lighten()
    methods = sorted(METHODS) if options.methods == "all" else options.methods.split(",")
    for model in options.model:
        out = (
            options.out if len(options.model) == 1 else os.path.join(options.out, os.path.basename(model.rstrip("/")))
        )
        os.makedirs(out, exist_ok=True)
        if options.vllm is not None and not os.path.exists(os.path.join(model, "config.json")):
            save_vllm_toy_policy(model)
        for method in methods:
            run(method, model, out, options.per_device_batch_size, options.steps, options.vllm, options.fsdp2)


if __name__ == "__main__":
    sys.exit(main())
