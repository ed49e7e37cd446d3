"""The locks must agree with pyproject.toml: re-lock (`python tools/lock.py`) whenever a
dependency range or extra changes."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tools.lock import DIGEST_PREFIX, LOCKS, ROOT, Lock, pyproject_digest

BY_NAME = {lock.path.name: lock for lock in LOCKS}


def locked(lock: Lock) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in lock.path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"requirements.lock: {line!r} is not pinned with =="
            pins[canonicalize_name(name)] = Version(version)
    return pins


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_lock_was_made_from_this_pyproject(name: str) -> None:
    first = BY_NAME[name].path.read_text().splitlines()[0]
    assert first.startswith(DIGEST_PREFIX), "requirements.lock was not made by tools/lock.py"
    assert first.removeprefix(DIGEST_PREFIX) == pyproject_digest(), (
        "pyproject.toml's dependencies changed since requirements.lock was made: "
        "run `python tools/lock.py` and commit the locks"
    )


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_every_requirement_is_pinned_inside_its_range(name: str) -> None:
    lock = BY_NAME[name]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    requirements = [*project["dependencies"], *(r for e in lock.extras for r in extras[e])]
    pins = locked(lock)
    for text in requirements:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is required by pyproject.toml but not in the lock"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"the lock pins {req.name}=={pins[name]}, outside pyproject's {req.specifier}"
        )


def test_the_digest_sees_a_changed_range(tmp_path: Path) -> None:
    original = (ROOT / "pyproject.toml").read_text()
    changed = tmp_path / "pyproject.toml"
    changed.write_text(original.replace('"optuna>=4.0"', '"optuna>=4.1"'))
    assert '"optuna>=4.0"' in original
    assert pyproject_digest(changed) != pyproject_digest()
