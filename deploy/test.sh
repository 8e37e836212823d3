#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs the
# whole ctest suite (unit, integration, sim, wan, fault, security, bench smoke).
# Extra arguments go to ctest, e.g. ./deploy/test.sh -L integration.
# A whole-suite run (no arguments) also runs:
#  - deploy/check.sh format (clang-format on the changed lines) before the build;
#  - the install test after ctest (tests/install/test.sh: `cmake --install` into
#    a temporary prefix, a client built against it with find_package, the .deb);
#  - deploy/check.sh clang: one clang build for -Wthread-safety -Werror on
#    every unit and ThreadSanitizer, then the TSan suites. The build runs
#    during ctest at the lowest CPU priority, so it takes only the CPU the
#    suite leaves idle (most of the suite waits on daemons and disks).
# The timing-sensitive suites (label `wan`: the link emulator and the bench
# smoke runs) run after the rest, alone on the machine, once the clang build
# is done.
# LONGHAUL_CHECKS names the checks to run whatever the arguments
# ("format clang"; empty for none). LONGHAUL_TEST_JOBS sets ctest's -j
# (default: twice the cores, since most tests wait rather than compute).
# Each step's time is printed at the end and kept in build/ci-steps.txt.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -eq 0 ]; then
  checks=" ${LONGHAUL_CHECKS-format clang} "
else
  checks=" ${LONGHAUL_CHECKS-} "
fi
checks=${checks/ tsa / clang }
checks=${checks/ tsan / clang }

steps=()
step() {  # step NAME COMMAND...: runs COMMAND, records how long it took, returns its status
  local name=$1 start=$SECONDS status=0
  shift
  "$@" || status=$?
  steps+=("$(printf '%-28s %5d s' "$name" $((SECONDS - start)))")
  return "$status"
}

clang_build_pid=
stop_clang_build() {
  if [ -n "$clang_build_pid" ]; then kill -- "-$clang_build_pid" 2>/dev/null || true; fi
}
trap stop_clang_build EXIT

total_start=$SECONDS
step "install-deps" "$root/deploy/install-deps.sh"
if [[ $checks == *" format "* ]]; then step "check format" "$root/deploy/check.sh" format; fi
step "build (gcc)" "$root/deploy/build.sh"

if [[ $checks == *" clang "* ]]; then
  # Its own session and process group, so that an early exit stops every
  # compiler it started.
  mkdir -p "$root/build-tsan"
  (cd "$root" && exec setsid nice -n 19 "$root/deploy/check.sh" clang-build \
    >"$root/build-tsan/background-build.log" 2>&1) &
  clang_build_pid=$!
fi
jobs=${LONGHAUL_TEST_JOBS:-$(($(nproc) * 2))}
cd "$root/build"
if [ $# -eq 0 ]; then
  step "ctest (all but wan)" ctest --output-on-failure -j "$jobs" --timeout 900 -LE wan
else
  step "ctest" ctest --output-on-failure -j "$jobs" --timeout 900 "$@"
fi
clang_build_status=0
if [ -n "$clang_build_pid" ]; then
  # The rest of the clang build, now with the machine to itself.
  step "clang build (rest)" wait "$clang_build_pid" || clang_build_status=$?
  clang_build_pid=
  if [ "$clang_build_status" -ne 0 ]; then
    cat "$root/build-tsan/background-build.log" >&2
    echo "test.sh: the clang build failed (above)" >&2
    exit 1
  fi
fi
if [ $# -eq 0 ]; then
  step "ctest (wan, alone)" ctest --output-on-failure --timeout 900 -L wan
  step "install test" "$root/tests/install/test.sh" "$root/build"
fi
if [[ $checks == *" clang "* ]]; then
  step "check clang (TSan suites)" "$root/deploy/check.sh" clang-tests
fi

steps+=("$(printf '%-28s %5d s' "total" $((SECONDS - total_start)))")
printf '%s\n' "${steps[@]}" | tee "$root/build/ci-steps.txt"
