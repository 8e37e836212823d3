#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs the
# whole ctest suite (unit, integration, sim, wan, fault, security, bench smoke).
# Extra arguments go to ctest, e.g. ./deploy/test.sh -L integration.
# A whole-suite run (no arguments) also runs:
#  - deploy/check.sh format (clang-format on the changed lines) before the build;
#  - the install test after ctest (tests/install/test.sh: `cmake --install` into
#    a temporary prefix, a client built against it with find_package, the .deb);
#  - deploy/check.sh clang: one clang build for -Wthread-safety -Werror on
#    every unit and ThreadSanitizer, then the TSan suites.
# ctest runs in two parts: everything but the timing-sensitive suites at
# twice the cores (most tests wait on daemons and disks), then label `wan`
# (the link emulator and the bench smoke runs), one at a time.
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

# The times so far, also when a step fails.
print_steps() {
  local status=$?
  steps+=("$(printf '%-28s %5d s' "total" $((SECONDS - total_start)))")
  printf '%s\n' "${steps[@]}" | tee "$root/build/ci-steps.txt" >&2
  return "$status"
}
total_start=$SECONDS
mkdir -p "$root/build"
trap print_steps EXIT
step "install-deps" "$root/deploy/install-deps.sh"
if [[ $checks == *" format "* ]]; then step "check format" "$root/deploy/check.sh" format; fi
step "build (gcc)" "$root/deploy/build.sh"

jobs=${LONGHAUL_TEST_JOBS:-$(($(nproc) * 2))}
cd "$root/build"
if [ $# -eq 0 ]; then
  step "ctest (all but wan)" ctest --output-on-failure -j "$jobs" --timeout 900 -LE wan
else
  step "ctest" ctest --output-on-failure -j "$jobs" --timeout 900 "$@"
fi
if [ $# -eq 0 ]; then
  step "ctest (wan, alone)" ctest --output-on-failure --timeout 900 -L wan
  step "install test" "$root/tests/install/test.sh" "$root/build"
fi
if [[ $checks == *" clang "* ]]; then
  step "check clang: build" "$root/deploy/check.sh" clang-build
  step "check clang: TSan suites" "$root/deploy/check.sh" clang-tests
fi

