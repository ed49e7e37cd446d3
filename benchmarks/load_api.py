"""Load on the tuning API: fixed-rate reads of a job and a recommendation while a job runs.

Starts `python -m tuner serve --workers 1` on 127.0.0.1 (SQLite under a temporary directory, the
worker on the CPU with one torch thread), runs one small job to completion (so that its `/best`
answers 200), starts a second, long job, and while that one runs, sends `GET /v1/jobs/{id}/best`
(the finished job) and `GET /v1/jobs/{id}` (the running job), alternately, at `--rate` requests
per second for `--duration` seconds: an open loop, each request sent at its scheduled time
whether or not earlier ones have been answered. Latency is measured from the scheduled time (so
a client or server that falls behind shows up in it). An error is any answer but 200, or no
answer within `--timeout-s`. Writes `<out>.json` and `<out>.md`.

    python benchmarks/load_api.py --rate 200 --duration 30 \\
        --out docs/benchmarks/api-load-$(date +%F)

Not a test: it measures this machine, whatever else runs on it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "load-benchmark-token-0123456789"
SMALL_JOB = {
    "workload": "mlp",
    "preset": "tiny",
    "trials": 3,
    "device": "cpu",
    "fix": {"num_workers": 0},
}
LONG_JOB = {
    "workload": "transformer",
    "preset": "tiny",
    "trials": 500,
    "device": "cpu",
    "fix": {"num_workers": 0},
}
WORKER_SETTINGS = {
    "measure_warmup": 2,
    "measure_windows": 5,
    "measure_window_steps": 20,
    "final_rounds": 1,
    "top_k": 2,
    "parity_steps": 4,
    "heartbeat_s": 1.0,
    "torch_threads": 1,
    "access_log": False,
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait(probe: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = probe()
        except httpx.TransportError:
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def _summary(latencies_ms: list[float]) -> dict[str, float | int]:
    if not latencies_ms:
        return {"n": 0}
    return {
        "n": len(latencies_ms),
        "p50_ms": _percentile(latencies_ms, 50),
        "p90_ms": _percentile(latencies_ms, 90),
        "p99_ms": _percentile(latencies_ms, 99),
        "max_ms": max(latencies_ms),
        "mean_ms": statistics.fmean(latencies_ms),
    }


class _Connection:
    """One HTTP/1.1 keep-alive connection: a minimal client, so that the load generator spends
    little of the machine's CPU (httpx spent about as much per request as the server did)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str
    ) -> None:
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, host: str, port: int) -> _Connection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer, f"{host}:{port}")

    async def get(self, path: str) -> int:
        self.writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
        )
        await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = next(
            int(line.split(":", 1)[1])
            for line in lines
            if line.lower().startswith("content-length:")
        )
        await self.reader.readexactly(length)
        return status

    def close(self) -> None:
        self.writer.close()


async def _drive(
    host: str,
    port: int,
    paths: list[str],
    rate: float,
    duration_s: float,
    timeout_s: float,
    connections: int,
) -> dict[str, Any]:
    """Send GET paths[i % len(paths)] at `rate` per second; latency from the scheduled time."""
    latencies: dict[str, list[float]] = {p: [] for p in paths}
    errors: dict[str, int] = {}
    idle: asyncio.Queue[_Connection] = asyncio.Queue()
    for _ in range(connections):
        idle.put_nowait(await _Connection.open(host, port))

    async def one(path: str, scheduled: float) -> None:
        connection = await idle.get()
        try:
            status = await asyncio.wait_for(connection.get(path), timeout_s)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            connection.close()
            idle.put_nowait(await _Connection.open(host, port))
            return
        idle.put_nowait(connection)
        if status != 200:
            errors[f"HTTP {status}"] = errors.get(f"HTTP {status}", 0) + 1
            return
        latencies[path].append((time.perf_counter() - scheduled) * 1e3)

    for i in range(4 * connections):  # warm the server and the connections up, unmeasured
        await one(paths[i % len(paths)], time.perf_counter())
    for values in latencies.values():
        values.clear()
    total = int(rate * duration_s)
    start = time.perf_counter() + 0.05
    tasks = []
    for i in range(total):
        scheduled = start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(paths[i % len(paths)], scheduled)))
    await asyncio.gather(*tasks)
    achieved = total / (time.perf_counter() - start)
    while not idle.empty():
        idle.get_nowait().close()
    return {"latencies": latencies, "errors": errors, "sent": total, "achieved_rate": achieved}


def _measure(tmp: Path, args: argparse.Namespace) -> tuple[dict[str, Any], list[str], Any]:
    """Start the server, make a finished and a running job, and drive the load."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    env |= {f"TUNER_{k.upper()}": str(v) for k, v in WORKER_SETTINGS.items()}
    env |= {
        "TUNER_STORAGE": f"sqlite:///{tmp}/load.db",
        "TUNER_API_TOKENS": TOKEN,
        "TUNER_WORKER_NICE": str(args.worker_nice),
    }
    with (tmp / "server.log").open("wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "tuner", "serve", "--port", str(port), "--workers", "1"],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            http = httpx.Client(
                base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
            )
            _wait(
                lambda: http.get("/healthz").json()["workers_alive"] >= 1,
                120,
                "the server and its worker",
            )
            finished = http.post("/v1/jobs", json=SMALL_JOB).json()["id"]
            _wait(
                lambda: http.get(f"/v1/jobs/{finished}").json()["status"] == "succeeded",
                120,
                "the small job to succeed",
            )
            running = http.post("/v1/jobs", json=LONG_JOB).json()["id"]
            _wait(
                lambda: http.get(f"/v1/jobs/{running}").json()["n_complete"] >= 1,
                120,
                "the long job to run",
            )
            paths = [f"/v1/jobs/{finished}/best", f"/v1/jobs/{running}"]
            result = asyncio.run(
                _drive(
                    "127.0.0.1",
                    port,
                    paths,
                    args.rate,
                    args.duration,
                    args.timeout_s,
                    args.connections,
                )
            )
            during = http.get(f"/v1/jobs/{running}").json()
            http.post(f"/v1/jobs/{running}/cancel")
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
    return result, paths, during


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load")
    parser.add_argument("--timeout-s", type=float, default=2.0, help="a slower answer is an error")
    parser.add_argument("--connections", type=int, default=16, help="keep-alive connections")
    parser.add_argument("--worker-nice", type=int, default=0, help="TUNER_WORKER_NICE")
    parser.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="streamtune-load-") as tmp:
        result, paths, during = _measure(Path(tmp), args)

    every = [ms for values in result["latencies"].values() for ms in values]
    report = {
        "date": dt.date.today().isoformat(),
        "what": "GET /v1/jobs/{id}/best (a finished job) and GET /v1/jobs/{id} (a running "
        "job), alternately, open loop, over HTTP/1.1 keep-alive on 127.0.0.1",
        "rate_per_s": args.rate,
        "duration_s": args.duration,
        "achieved_rate_per_s": result["achieved_rate"],
        "sent": result["sent"],
        "errors": result["errors"],
        "n_errors": sum(result["errors"].values()),
        "latency_from_scheduled_send": _summary(every),
        "by_endpoint": {
            "GET /v1/jobs/{id}/best": _summary(result["latencies"][paths[0]]),
            "GET /v1/jobs/{id}": _summary(result["latencies"][paths[1]]),
        },
        "running_job_during_load": {
            k: during.get(k) for k in ("status", "n_complete", "n_failed", "n_pruned", "phase")
        },
        "setup": {
            "server": "python -m tuner serve --workers 1 (uvicorn, 1 process), SQLite (WAL)",
            "worker": WORKER_SETTINGS | {"worker_nice": args.worker_nice, "job": LONG_JOB},
            "client": f"this script (asyncio, a minimal HTTP/1.1 client), {args.connections} "
            "keep-alive connections, on the same machine",
        },
        "load_average_1m": {"before": load_before, "after": os.getloadavg()[0]},
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "processor": platform.processor(),
        },
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(text + "\n", encoding="utf-8")
        args.out.with_suffix(".md").write_text(_markdown(report), encoding="utf-8")


def _markdown(report: dict[str, Any]) -> str:
    rows = [("all", report["latency_from_scheduled_send"]), *report["by_endpoint"].items()]
    lines = [
        f"# API load, {report['date']}",
        "",
        f"{report['what']}: {report['rate_per_s']:.0f} requests/s for "
        f"{report['duration_s']:.0f} s (achieved {report['achieved_rate_per_s']:.1f}/s), "
        f"while a tuning job ran on the same machine ({report['machine']['cpus']} CPUs; "
        f"{report['machine']['platform']}).",
        "",
        "| requests | n | p50 ms | p90 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, s in rows:
        lines.append(
            f"| {name} | {s['n']} | {s['p50_ms']:.2f} | {s['p90_ms']:.2f} | "
            f"{s['p99_ms']:.2f} | {s['max_ms']:.2f} |"
        )
    lines += [
        "",
        f"Errors: {report['n_errors']} {json.dumps(report['errors'])}. Latency is measured from "
        "each request's scheduled send time (open loop), so it includes any time the client "
        "itself fell behind. The worker runs at niceness "
        f"{report['setup']['worker']['worker_nice']} (`TUNER_WORKER_NICE`); the API "
        "process runs with `gc.freeze()` after start-up (see `api/server.py`); 1-minute load "
        "average before "
        f"the run {report['load_average_1m']['before']:.2f}, after "
        f"{report['load_average_1m']['after']:.2f} (the server, its worker and this client "
        "account for about 1.5 of it).",
        "",
        f"Setup: {report['setup']['server']}; worker settings "
        f"`{json.dumps(report['setup']['worker'])}`; client: {report['setup']['client']}.",
        "",
        "Reproduce: `python benchmarks/load_api.py --rate 200 --duration 30 --out "
        "docs/benchmarks/api-load-<date>`.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
