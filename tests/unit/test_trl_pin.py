"""The supported TRL range is written once, `trl_entropy.core.trl.pin.TRL_REQUIREMENT`: setup.py's install requirement
is that string, read without importing the package, the import-time check compares with its bounds, and the docs state
the same range. (The built wheel's metadata: tests/trainer/test_base.py.)"""

import re
import runpy
import sys
from pathlib import Path

import pytest
import setuptools
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from trl_entropy.core.trl.pin import TRL_MAX_EXCLUSIVE, TRL_MIN, TRL_REQUIREMENT, check_trl_version


ROOT = Path(__file__).resolve().parents[2]


def setup_keywords(monkeypatch) -> dict:
    """What setup.py passes to ``setuptools.setup``, run as pip runs it (from the project's folder), where neither
    the package nor TRL may be imported: pip runs it before the dependencies are installed."""
    keywords = {}
    monkeypatch.setattr(setuptools, "setup", lambda **given: keywords.update(given))
    for name in ("trl_entropy", "trl_entropy.core.trl.pin", "trl"):
        monkeypatch.setitem(sys.modules, name, None)  # an import of these raises ImportError
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(ROOT / "setup.py"), run_name="__main__")
    return keywords


def test_setup_py_requires_exactly_the_trl_range_the_import_checks(monkeypatch):
    requires = setup_keywords(monkeypatch)["install_requires"]
    assert [line for line in requires if Requirement(line).name == "trl"] == [TRL_REQUIREMENT]


def test_setup_py_takes_the_packages_version(monkeypatch):
    """The version is written once, ``trl_entropy.__version__``; setup.py reads it from the file's text."""
    import trl_entropy

    version = trl_entropy.__version__
    assert setup_keywords(monkeypatch)["version"] == version
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version


def test_the_import_check_uses_the_requirements_bounds():
    specifier = Requirement(TRL_REQUIREMENT).specifier
    assert SpecifierSet(f">={TRL_MIN},<{TRL_MAX_EXCLUSIVE}") == specifier
    for installed in ("1.15.2", str(TRL_MIN), "1.16.7", str(TRL_MAX_EXCLUSIVE), "1.17.1", "2.0.0"):
        if specifier.contains(installed):
            assert check_trl_version(installed) == installed
        else:
            with pytest.raises(ImportError, match=f"Run: pip install 'trl>={TRL_MIN},<{TRL_MAX_EXCLUSIVE}'"):
                check_trl_version(installed)


def test_the_docs_state_the_same_trl_range():
    stated = {
        f"{path.relative_to(ROOT)}: {text}": SpecifierSet(text.removeprefix("trl"))
        for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for text in re.findall(r"`(trl[<>=~!][^`]*)`", path.read_text())
    }
    assert stated, "no document states the supported TRL range"
    assert {
        where: specifier for where, specifier in stated.items() if specifier != Requirement(TRL_REQUIREMENT).specifier
    } == {}
