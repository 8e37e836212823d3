#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs the
# whole ctest suite (unit, integration, sim, wan, fault, security, bench smoke).
# Extra arguments go to ctest, e.g. ./deploy/test.sh -L integration.
# A whole-suite run (no arguments) also runs:
#  - deploy/check.sh format (clang-format on the changed lines) before the build;
#  - the install test after ctest (tests/install/test.sh: `cmake --install` into
#    a temporary prefix, a client built against it with find_package, the .deb);
#  - deploy/check.sh clang: one clang build that compiles every target with
#    -Wthread-safety -Werror and ThreadSanitizer, then the TSan suites. The
#    build runs during ctest at the lowest CPU priority, so it takes only the
#    CPU the suite leaves idle (most of the suite waits on daemons and disks).
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
step() {  # step NAME COMMAND...: runs COMMAND and records how long it took
  local name=$1 start=$SECONDS
  shift
  "$@"
  steps+=("$(printf '%-28s %5d s' "$name" $((SECONDS - start)))")
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
  # Its own process group, so that an early exit stops every compiler it ran.
  mkdir -p "$root/build-tsan"
  (cd "$root" && exec setsid nice -n 19 bash -c \
    'cmake --preset tsan >/dev/null && cmake --build --preset tsan' \
    >"$root/build-tsan/background-build.log" 2>&1) &
  clang_build_pid=$!
fi
cd "$root/build"
step "ctest" ctest --output-on-failure -j "${LONGHAUL_TEST_JOBS:-$(($(nproc) * 2))}" \
  --timeout 900 "$@"
if [ $# -eq 0 ]; then
  step "install test" "$root/tests/install/test.sh" "$root/build"
fi
if [ -n "$clang_build_pid" ]; then
  # The rest of the clang build at full priority; its errors, if any, show here.
  wait "$clang_build_pid" || true
  clang_build_pid=
  step "check clang" "$root/deploy/check.sh" clang
fi

steps+=("$(printf '%-28s %5d s' "total" $((SECONDS - total_start)))")
printf '%s\n' "${steps[@]}" | tee "$root/build/ci-steps.txt"
