"""The README's service section runs as written (issue 27): its shell block, extracted from the
section and run by bash in an empty directory, sets the token, starts `python -m tuner serve` on
127.0.0.1:8000, posts a job as JSON, takes its id from the answer, waits for it, and reads its
recommendation and report, then stops the server. Nothing in the commands is changed."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.api.helpers import clean_env
from tuner.service.jobstore import JobStore

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
HEADING = "## The service\n"


def service_commands(readme: str) -> str:
    """The bash blocks of the README's service section, in order."""
    section = readme[readme.index(HEADING) + len(HEADING) :]
    section = section[: section.find("\n## ")] if "\n## " in section else section
    return "\n".join(re.findall(r"```bash\n(.*?)```", section, re.S))


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_the_section_is_what_this_test_runs() -> None:
    script = service_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    assert "export TOKEN=" in script  # the token is set before it is used
    assert script.count('-H "Content-Type: application/json"') == 1  # on the one POST
    assert "/v1/jobs/$JOB/best" in script and "/v1/jobs/1/" not in script  # ids from answers
    assert script.index("export TOKEN=") < script.index("$TOKEN")
    assert service_commands("# x\n## The service\n```bash\na\n```\n## Next\n```bash\nb\n```") == (
        "a\n"
    )


def test_the_readme_service_commands_run_as_written(tmp_path: Path) -> None:
    if not _port_free(8000):
        pytest.skip("127.0.0.1:8000, which the README's commands use, is taken on this machine")
    script = service_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    env = clean_env() | {
        "PYTHONPATH": str(ROOT),  # the checkout stands for the installed package
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    log = tmp_path / "stderr.log"
    with log.open("wb") as errors:
        proc = subprocess.Popen(
            ["bash", "-e", "-c", script],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=errors,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=900)
        finally:
            deadline = time.monotonic() + 60  # the server stops its workers, then exits
            while not _port_free(8000) and time.monotonic() < deadline:
                time.sleep(0.5)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    text = out.decode("utf-8", "replace")
    assert proc.returncode == 0, text[-3000:] + log.read_text(errors="replace")[-3000:]
    # The server's access log shares stdout: the recommendation is the JSON object in it.
    best, _ = json.JSONDecoder().raw_decode(text[text.index('{"study":') :])
    job_id = best["study"].removeprefix("job-")
    assert len(job_id) == 32 and best["config"] is not None and best["workload"] == "mlp"
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and best["study"] in page
    row = JobStore(f"sqlite:///{tmp_path}/tuner.db").get(job_id)
    assert (row.status, row.owner, row.trials) == ("succeeded", "me", 3)  # the token's name
    assert _port_free(8000)  # `kill $SERVER` stopped it
