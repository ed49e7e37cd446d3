#!/usr/bin/env bash
# Run a queue of benchmark commands on a lent GPU machine across several device calls.
#
# A device call ends after at most 10 minutes and kills what it started, except a process in a
# new session, which runs on until the machine goes back (30 s after a call, unless the next call
# comes first). A job longer than one call (the 1B default job: up to 15 minutes) or a queue of
# jobs meant to share one machine then runs like this:
#
#   tools/device_queue.sh start QUEUE LIMIT_S   # first call: install, copy the tree, start QUEUE
#   tools/device_queue.sh wait LIMIT_S          # each next call, made within the 30 s window
#
# QUEUE is a bash file, named by its path from the repository root, where the call starts; the
# queues that ran are kept as records in docs/benchmarks/raw/queues/, and one runs again as
#   tools/device_queue.sh start docs/benchmarks/raw/queues/2026-11-27-heldout-3.sh 570
# It runs from a private copy of the working tree (`$QUEUE_STATE/repo`;
# QUEUE_STATE defaults to /tmp/queue), so the next call's copy of the tree cannot change files
# under a running job, with PYTHONPATH set to the carried wheels (`.whl/`, from
# tools/gpu_wheels.sh; installed when present) and to that copy, and QUEUE_OUT set to the folder
# its results go to. Both modes wait until the queue ends or LIMIT_S seconds pass,
# copying QUEUE_OUT and the queue's log to $OUT every 15 s, so a call that ends keeps what the
# queue wrote so far. Each exits 0 once the queue has ended, 3 while it still runs. A polling
# interval other than 15 s: QUEUE_POLL_S.
# A queue that records its commit takes it from STREAMTUNE_COMMIT: give the literal commit
# (`STREAMTUNE_COMMIT=abc1234 tools/device_queue.sh start ...`), not `$(git rev-parse HEAD)`, which
# on the lent machine names the last commit that landed, not the working tree it was given
# (2026-11-28: a run of 906d367 printed a1a131e).
set -euo pipefail
mode=${1:?usage: device_queue.sh start QUEUE LIMIT_S | wait LIMIT_S}
state=${QUEUE_STATE:-/tmp/queue}
out=${OUT:?OUT is the result folder of the device call}

copy_back() {
  # One archive and the log: a call brings back only so many files (8 on 2026-11-25; the
  # rest of that queue's results were lost with the machine).
  tar -czf "$out/queue.tar.gz.part" -C "$state/out" . 2>/dev/null \
    && mv "$out/queue.tar.gz.part" "$out/queue.tar.gz"
  cp "$state/log" "$out/queue.log" 2>/dev/null || true
}

watch_until() {
  local limit=$1 started=$SECONDS
  while ((SECONDS - started < limit)); do
    copy_back
    if [[ -f $state/rc ]]; then
      echo "queue ended with exit code $(cat "$state/rc") after $(($(date +%s) - $(cat "$state/started"))) s"
      copy_back
      return 0
    fi
    sleep "${QUEUE_POLL_S:-15}"
  done
  copy_back
  echo "queue still running after $(($(date +%s) - $(cat "$state/started"))) s: call 'wait' again within 30 s"
  return 3
}

case $mode in
  start)
    queue=${2:?start needs the queue file}
    limit=${3:?start needs LIMIT_S}
    if [[ -d $state ]]; then
      echo "a queue already ran on this machine ($state): use 'wait'" >&2
      exit 2
    fi
    mkdir -p "$state/out" "$state/site"
    if compgen -G ".whl/*.whl" > /dev/null; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$state/site" .whl/*.whl > "$state/pip.log" 2>&1
    fi
    mkdir -p "$state/repo"
    tar --exclude=./.whl --exclude=./.git -cf - . | tar -xf - -C "$state/repo"
    date +%s > "$state/started"
    # setsid: a new session, so the queue outlives this call (see the header).
    # No descriptor of this call stays open in it: the call's output would never end.
    (
      cd "$state/repo"
      export PYTHONPATH="$state/site:$state/repo" QUEUE_OUT="$state/out" PYTHONUNBUFFERED=1
      exec setsid bash -c "bash '$queue' > '$state/log' 2>&1; echo \$? > '$state/rc'"
    ) < /dev/null > /dev/null 2>&1 &
    watch_until "$limit"
    ;;
  wait)
    limit=${2:?wait needs LIMIT_S}
    if [[ ! -d $state ]]; then
      echo "no queue on this machine: the machine went back, or 'start' never ran" >&2
      exit 2
    fi
    watch_until "$limit"
    ;;
  *)
    echo "usage: device_queue.sh start QUEUE LIMIT_S | wait LIMIT_S" >&2
    exit 2
    ;;
esac
