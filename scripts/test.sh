#!/usr/bin/env bash
# Runs the whole test suite. pytest's exit code 5 (no tests collected) counts as a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m tests.hosts || echo "host: could not be described" >&2  # which CPU and vector ISA this run is on
# One worker per logical CPU (the CPUs this process may use); a test module (or class) stays on one worker, so its shared fixtures are built once.
python3 -m pytest -q -p no:cacheprovider -n logical --dist loadscope "$@" tests
rc=$?
if [ "$rc" -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi
exit "$rc"
