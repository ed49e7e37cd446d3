"""The LibTorch trainer's build, shared by its CPU and GPU tests.

Building needs cmake and a C++17 compiler. Where they are missing the tests skip, unless
STREAMTUNE_REQUIRE_LIBTORCH=1 (set by .ci/run, which installs them): then they fail.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from benchmarks.libtorch_seed import example_module as load_example
from trainers.program import Program, load_registry

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "examples" / "libtorch"
REGISTRY = HERE / "programs.json"


@pytest.fixture(scope="session")
def binary() -> Path:
    if shutil.which("cmake") is None or shutil.which("c++") is None:
        if os.environ.get("STREAMTUNE_REQUIRE_LIBTORCH") == "1":
            pytest.fail("cmake and a C++ compiler are needed to build examples/libtorch")
        pytest.skip("cmake or a C++ compiler is missing")
    path: Path = load_example("build").build(HERE / "build", quiet=True)
    assert path.exists()
    return path


@pytest.fixture
def program(binary: Path) -> Program:
    return load_registry(REGISTRY)["libtorch-transformer"]
