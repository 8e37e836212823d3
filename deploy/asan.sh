#!/usr/bin/env bash
# Builds the `asan` preset (Debug, AddressSanitizer + UndefinedBehaviorSanitizer)
# into build-asan/ and runs the unit, integration, fault, security and
# exchange suites under it. Left out: wan/bench/load (timing under a 2-3x
# slower build says nothing), fuzz (has its own clang build) and python (the
# binding would need libasan preloaded into the interpreter).
# Extra arguments go to ctest (e.g. -R storage).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/deploy/install-deps.sh"
cd "$root"
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$(nproc)"
# halt_on_error: the first report fails the test that triggered it.
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
ctest --preset asan -j "$(nproc)" --timeout 1800 "$@"
