#!/usr/bin/env bash
# Runs the host-sensitive tests on an emulated x86-64 CPU: qemu-user (TCG) with a named CPU model runs
# Python, NumPy, llvmlite and the generated code, so LLVM's host detection, NumPy's dispatch and
# Cuvil's host profile all see that CPU (EPYC-Milan: Zen 3, AVX2 and FMA, no AVX-512). It checks on a
# machine of one kind what the suite does on another; it proves correctness, never speed, and takes
# tens of minutes, so it is not part of .ci/run.
#
# Usage: scripts/emulated_host_tests.sh [QEMU_CPU [PYTEST_ARGS...]]
#   QEMU_CPU: a model of `qemu-x86_64 -cpu help` (default EPYC-Milan; Haswell is an Intel AVX2 core).
#   PYTEST_ARGS: tests to run instead of the host-sensitive subset below.
# Needs qemu-user 7.2 or newer (the first with AVX2 in TCG): apt-get install qemu-user.
set -uo pipefail
cd "$(dirname "$0")/.."

cpu="${1:-EPYC-Milan}"
shift $(( $# > 0 ? 1 : 0 ))
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
  tests=(tests/devices/test_detect.py tests/devices/test_isa.py
         tests/compiler/codegen/test_pool.py tests/compiler/codegen/test_winograd.py
         tests/compiler/codegen/test_conv.py tests/compiler/codegen/test_conv_choices.py
         tests/compiler/codegen/test_conv_rows.py tests/compiler/codegen/test_conv_dwlanes.py
         tests/compiler/codegen/test_quant_kernels.py tests/compiler/codegen/test_gemm.py
         tests/edge_runtime/test_parallel.py tests/edge_runtime/test_session.py tests/edge_runtime/test_cache.py
         tests/edge_runtime/test_host_memo.py tests/edge_runtime/test_objload.py tests/edge_runtime/test_threads.py
         tests/edge_runtime/test_autotune.py tests/edge_runtime/test_stream.py tests/edge_runtime/test_sealed.py
         tests/compiler/test_zoo.py tests/compiler/test_int8_zoo.py)
fi

qemu=$(command -v qemu-x86_64) || { echo "qemu-x86_64 not found: apt-get install qemu-user" >&2; exit 2; }
[ "$(uname -m)" = x86_64 ] || { echo "this check emulates an x86-64 CPU on an x86-64 host" >&2; exit 2; }
# TCG lacks some of a model's features (rdseed, sha-ni, ...) and warns on every start; they are turned off
# so that the warnings do not reach the output tests read. LLVM then sees exactly what TCG runs.
off=$("$qemu" -cpu "$cpu" /bin/true 2>&1 | sed -n 's/.*CPUID[^ ]*\.\([a-z0-9_.-]*\) \[bit.*/\1/p' | sort -u |
      sed 's/^/,-/' | tr -d '\n')
"$qemu" -cpu "$cpu$off" /bin/true || { echo "qemu-x86_64 has no CPU model $cpu" >&2; exit 2; }

# A throwaway virtual environment whose python is this one under qemu: pytest's workers and every
# Python child a test starts (sys.executable) run emulated too, and see the same site-packages.
real=$(python3 -c 'import os, sys; print(os.path.realpath(sys.executable))')
prefix=$(python3 -c 'import sys; print(sys.prefix)')
venv=$(mktemp -d "${TMPDIR:-/tmp}/cuvil-emulated.XXXXXX")
trap 'rm -rf "$venv"' EXIT
mkdir "$venv/bin"
printf 'home = %s\ninclude-system-site-packages = true\n' "$(dirname "$real")" > "$venv/pyvenv.cfg"
[ -d "$prefix/lib" ] && [ "$prefix" != "$(python3 -c 'import sys; print(sys.base_prefix)')" ] && ln -s "$prefix/lib" "$venv/lib"
printf '#!/bin/sh\nexec %q -cpu %q -0 "$0" %q "$@"\n' "$qemu" "$cpu$off" "$real" > "$venv/bin/python"
chmod +x "$venv/bin/python"
ln -s python "$venv/bin/python3"

echo "emulated CPU: qemu-x86_64 -cpu $cpu (TCG); features TCG lacks, off: ${off#,}"
echo "real CPU: $(python3 -m tests.hosts)"
"$venv/bin/python" -m tests.hosts | sed 's/^host:/emulated host:/' || { echo "python does not start under qemu" >&2; exit 1; }
"$venv/bin/python" -c 'import numpy as np; print("numpy dispatch:", " ".join(sorted(k for k, v in np._core._multiarray_umath.__cpu_features__.items() if v and k.startswith(("AVX", "FMA")))))'
start=$(date +%s)
# --dist load: a worker that dies (see docs/testing.md for what qemu itself breaks) is replaced and the
# run goes on; -rfE lists what failed at the end.
PATH="$venv/bin:$PATH" "$venv/bin/python" -m pytest -q -rfE -p no:cacheprovider -n "${EMULATED_WORKERS:-2}" \
  --dist load --max-worker-restart 20 "${tests[@]}"
rc=$?
echo "emulated run ($cpu): $(( $(date +%s) - start )) s, pytest exit $rc"
exit "$rc"
