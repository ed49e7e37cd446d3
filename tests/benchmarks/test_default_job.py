"""benchmarks/default_job.py on the CPU: two real jobs in their own processes, timed, with every
trial's phases read back from the study; the comparison with a peers record. The timings
themselves are GPU evidence (docs/benchmarks/default-job-*)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import default_job
from tests.tuner.tiny import RUN_FLAGS


def _passed() -> list[str]:
    """RUN_FLAGS without the workload and preset, which the script's own flags give."""
    pairs = dict(zip(RUN_FLAGS[::2], RUN_FLAGS[1::2], strict=True))
    return [w for k, v in pairs.items() if k not in ("--workload", "--preset") for w in (k, v)]


def test_two_jobs_are_timed_and_their_trials_phases_recorded(tmp_path: Path) -> None:
    reference = tmp_path / "peers.json"
    reference.write_text(
        json.dumps(
            {
                "meta": {"commit": "abc1234"},
                "presets": [
                    {
                        "workload": "mlp",
                        "preset": "tiny",
                        "precision": "fp32",  # what a job given no --precision runs in
                        # Far slower than any tiny CPU step: this run is "as fast".
                        "harness": {"recommended": {"median_ms": 1e6, "ci95": [9e5, 1.1e6]}},
                    }
                ],
            }
        )
    )
    scratch = tmp_path / "scratch"
    # Two calls on one scratch, as two device calls on one warm machine: the second continues
    # the first's record on its database and caches.
    for runs in ("cold", "warm"):
        default_job.main(
            [
                "--workload", "mlp", "--preset", "tiny", "--device", "cpu", "--runs", runs,
                "--reference", str(reference), "--out", str(tmp_path), "--tag", "t",
                "--scratch", str(scratch), "--", *_passed(), "--trials", "2",
            ]
        )  # fmt: skip
    [path] = tmp_path.glob("default-job-*-t.json")
    data = json.loads(path.read_text())
    assert data["meta"]["commit"] == "unknown" and data["reference"]["median_ms"] == 1e6
    assert [r["run"] for r in data["runs"]] == ["cold", "warm"]
    for run in data["runs"]:
        assert run["returncode"] == 0, run.get("error")
        assert run["wall_s"] > 0 and run["within_aim"] is True  # a tiny CPU job: seconds
        assert run["recommendation"]["n_trials"]["complete"] == 2
        # Both baselines ran here: no failure kept, each with its speed-up.
        assert run["recommendation"]["failures"] == {}
        assert set(run["recommendation"]["speedup"]) == {"pytorch-default", "seed-baseline"}
        assert [t["number"] for t in run["trials"]] == [0, 1]
        for trial in run["trials"]:
            assert trial["state"] == "complete" and trial["samples_per_s"] > 0
            assert trial["phases_s"]["measure"] > 0 and trial["seconds"] > 0
        assert run["time"]["wall_s"] > 0 and run["time"]["phases"]["final_round"] > 0
        median, low, high = run["step_ms"]
        assert low <= median <= high
        assert run["vs_reference"]["as_fast"] is True
        assert (tmp_path / run["log"]).read_text().count("] trial ") == 2  # its progress lines
    # Both studies in one database, the second a new study (not a resume of the first).
    assert data["runs"][1]["command"].endswith("--study warm --json")
    assert data["storage"] == f"sqlite:///{scratch.resolve() / 'tuner.db'}"
    assert all(data["storage"] in r["command"] for r in data["runs"])
    # A run name already on the scratch is refused, not run twice into one study.
    with pytest.raises(SystemExit, match="--runs: warm already ran on this --scratch"):
        default_job.main(["--workload", "mlp", "--runs", "warm", "--device", "cpu",
                          "--out", str(tmp_path), "--scratch", str(scratch)])  # fmt: skip
    # So is another commit's record: its runs and this call's do not belong together.
    with pytest.raises(SystemExit, match="--scratch: its record was made with commit 'unknown'"):
        default_job.main(["--workload", "mlp", "--runs", "again", "--device", "cpu",
                          "--out", str(tmp_path), "--scratch", str(scratch),
                          "--commit", "abc1234"])  # fmt: skip
    markdown = path.with_suffix(".md").read_text()
    assert "| cold | " in markdown and "| warm | " in markdown
    assert markdown.count("- cold trial ") == 2 and "Reference: `peers.json`" in markdown


def test_as_fast_means_this_runs_interval_reaches_the_references() -> None:
    reference = {"median_ms": 10.0, "ci95": [9.8, 10.2]}
    # ms/step from a throughput interval: the slower bound of throughput is the longer step.
    assert default_job.step_ms_interval(
        {"step_ms": 10.0, "throughput": {"median": 100.0, "ci95": [80.0, 125.0]}}
    ) == pytest.approx((10.0, 8.0, 12.5))
    overlapping = default_job.compare({"step_ms": (10.4, 10.1, 10.7)}, reference)
    assert overlapping == {"reference_over_run": pytest.approx(10.0 / 10.4), "as_fast": True}
    slower = default_job.compare({"step_ms": (10.6, 10.3, 10.9)}, reference)
    assert slower is not None and slower["as_fast"] is False
    assert default_job.compare({"step_ms": None}, reference) is None


def test_distinct_run_names_are_required() -> None:
    with pytest.raises(SystemExit, match="--runs: expected distinct names"):
        default_job.main(["--runs", "cold,cold"])


def test_the_reference_is_the_peers_record_of_what_the_job_ran(tmp_path: Path) -> None:
    """Defaults resolved: the job's own workload, preset, model options and precision, never
    what the flags left out (`--workload hf:causal-lm` alone runs preset small, not GPT-2)."""
    record = {
        "meta": {"commit": "abc1234"},
        "presets": [
            {
                "workload": "hf:causal-lm",
                "preset": preset,
                "model_args": args,
                "precision": "bf16-autocast",
                "harness": {"recommended": {"median_ms": ms, "ci95": [ms, ms]}},
            }
            for preset, args, ms in (
                ("default", {}, 12.7),
                ("small", {}, 3.0),
                ("small", {"layers": "8"}, 5.0),
            )
        ],
    }
    path = tmp_path / "peers.json"
    path.write_text(json.dumps(record))
    ran = {"workload": "hf:causal-lm", "preset": "small", "precision": "bf16-autocast"}
    assert default_job.reference_of(path, ran | {"model_args": {}})["median_ms"] == 3.0
    assert default_job.reference_of(path, ran | {"model_args": {"layers": "8"}})["median_ms"] == 5.0
    assert default_job.reference_of(path, ran | {"preset": "default"})["median_ms"] == 12.7
    assert default_job.reference_of(path, ran | {"precision": "tf32"}) is None


def test_a_records_own_aims_are_the_ones_it_is_judged_by() -> None:
    """`--aim-cold 900` (issue 32's aim for a 1B model) is kept in the record and printed; a
    record without aims (before the flags) is judged by issue 29's."""
    meta = dict.fromkeys(
        ("gpu", "driver", "cuda", "torch", "commit", "date", "file", "command"), "x"
    )
    run = {"run": "cold", "wall_s": 818.0, "returncode": 1, "error": "x"}
    scaled = default_job.to_markdown({"meta": meta | {"aims_s": {"cold": 900.0}}, "runs": [run]})
    assert "| cold | 818 (900) | failed: exit 1 |" in scaled
    assert "| cold | 818 (480) |" in default_job.to_markdown({"meta": meta, "runs": [run]})
    assert default_job.aim_of("warm2", {"cold": 900.0, "warm": 300.0}) == 300.0
    assert default_job.aim_of("again") is None
    with pytest.raises(SystemExit, match=r"--aim-cold: expected seconds > 0, got 0\.0"):
        default_job.main(["--aim-cold", "0"])


def test_a_failed_baselines_reason_is_printed_with_the_run() -> None:
    """At 1.1B, 16 x 2048 tokens, both eager baselines ran out of memory: the record keeps why
    (the study that also holds it stays on the machine)."""
    meta = dict.fromkeys(
        ("gpu", "driver", "cuda", "torch", "commit", "date", "file", "command"), "x"
    )
    why = "oom: out of memory: asked for 3.91 GiB with 2.38 GiB free of 79.18 GiB"
    run = {
        "run": "cold",
        "wall_s": 807.0,
        "returncode": 0,
        "recommendation": {"failures": {"seed-baseline": why}, "speedup": {}},
    }
    text = default_job.to_markdown({"meta": meta, "runs": [run]})
    assert f"cold: baseline seed-baseline failed: {why}" in text
    ran = default_job.to_markdown({"meta": meta, "runs": [run | {"recommendation": {}}]})
    assert "failed:" not in ran
