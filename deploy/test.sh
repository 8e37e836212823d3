#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs the
# whole ctest suite (unit, integration, sim, wan, fault, security, bench smoke).
# Extra arguments go to ctest, e.g. ./deploy/test.sh -L integration.
# A whole-suite run (no arguments) also runs:
#  - deploy/check.sh format (clang-format on the changed lines) before the build;
#  - the install test after ctest (tests/install/test.sh: `cmake --install` into
#    a temporary prefix, a client built against it with find_package, the .deb);
#  - deploy/check.sh tsa and tsan (the clang thread-safety build, the TSan suites).
# LONGHAUL_CHECKS names the checks to run whatever the arguments
# ("format tsa tsan"; empty for none).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -eq 0 ]; then
  checks=" ${LONGHAUL_CHECKS-format tsa tsan} "
else
  checks=" ${LONGHAUL_CHECKS-} "
fi
"$root/deploy/install-deps.sh"
if [[ $checks == *" format "* ]]; then "$root/deploy/check.sh" format; fi
"$root/deploy/build.sh"
cd "$root/build"
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"
if [ $# -eq 0 ]; then
  "$root/tests/install/test.sh" "$root/build"
fi
for c in tsa tsan; do
  if [[ $checks == *" $c "* ]]; then "$root/deploy/check.sh" "$c"; fi
done
