"""Compile artefacts that travel (`tuner.search.measuring.artifacts`): a job saves what it compiled,
and a job on a machine whose compile cache is empty loads them and compiles warm. Each job runs in a
process of its own (a machine of its own, as far as torch's caches go), compiling for real with
Inductor on the CPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tuner.search.measuring.artifacts import ARTIFACTS_FILE, load

ROOT = Path(__file__).resolve().parents[3]
JOB = """
import json, sys
from tests.tuner.tiny import load, options, run_json
storage, study = sys.argv[1], sys.argv[2]
rec = run_json(options(storage, study, trials=1, space="compile",
                       fix=("num_workers=0", "compile=default", "optimizer=foreach")))
trial = load(storage, study).trials[0]
print(json.dumps({"artifacts": rec["search"]["compile_artifacts"],
                  "compile": trial.user_attrs["compile"]}))
"""


def _job(tmp_path: Path, name: str, cache: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env["TUNER_COMPILE_CACHE"] = str(cache)
    done = subprocess.run(
        [sys.executable, "-c", JOB, f"sqlite:///{tmp_path / name}.db", name],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
def test_a_job_on_an_empty_cache_loads_what_an_earlier_job_saved_and_compiles_warm(
    tmp_path: Path,
) -> None:
    first_cache, moved, cold = tmp_path / "first", tmp_path / "moved", tmp_path / "cold"
    first = _job(tmp_path, "first", first_cache)
    assert first["artifacts"]["loaded"] == 0 and first["artifacts"]["saved"] > 0
    assert (first_cache / ARTIFACTS_FILE).stat().st_size > 0
    # Another machine: an empty compile cache, and the artefacts file alone copied into it.
    moved.mkdir()
    shutil.copy(first_cache / ARTIFACTS_FILE, moved / ARTIFACTS_FILE)
    warm = _job(tmp_path, "moved", moved)
    assert warm["artifacts"]["loaded"] > 0
    assert warm["compile"]["cache_hits"] > 0
    # The same job on an empty cache without the file compiles cold: the file made the hits.
    control = _job(tmp_path, "cold", cold)
    assert control["artifacts"]["loaded"] == 0
    assert control["compile"]["cache_hits"] == 0 and control["compile"]["cache_misses"] > 0


def test_a_file_torch_cannot_read_is_one_reason_and_no_failure(tmp_path: Path) -> None:
    assert load(tmp_path) == (0, None)  # no file: nothing to say
    assert load(None) == (0, None)
    (tmp_path / ARTIFACTS_FILE).write_bytes(b"not the artefacts of any torch")
    loaded, why = load(tmp_path)
    assert loaded == 0 and why is not None and len(why.splitlines()) == 1
