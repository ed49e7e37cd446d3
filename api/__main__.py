"""`python -m api`: serve the tuning API and this node's workers (what `python -m tuner serve`
runs; the tuner's CLI starts it as a program so that `tuner` never imports `api`)."""

from __future__ import annotations

import argparse
import sys

import trainers
from api.server import serve
from tuner.errors import TunerError


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m api", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes (default: $TUNER_WORKERS, else one per GPU)",
    )
    parser.add_argument("--no-worker", action="store_true", help="start no worker")
    parser.add_argument("--storage", default=None, help="database URL (default: $TUNER_STORAGE)")
    args = parser.parse_args(argv)
    try:
        serve(
            host=args.host,
            port=args.port,
            workers=args.workers,
            no_worker=args.no_worker,
            storage=args.storage,
        )
    except (TunerError, trainers.ConfigError) as exc:
        # A setting's ConfigError (TUNER_PROGRAMS naming no file) names it: one line, as
        # `worker` says it, not a traceback.
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc


if __name__ == "__main__":
    main()
