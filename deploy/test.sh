#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs the
# whole ctest suite (unit, integration, sim, wan, fault, security, bench smoke),
# then the install test (tests/install/test.sh: `cmake --install` into a
# temporary prefix, a client built against it with find_package, the .deb).
# Extra arguments go to ctest, e.g. ./deploy/test.sh -L integration; the
# install test runs only with the whole suite.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/deploy/build.sh"
cd "$root/build"
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"
if [ $# -eq 0 ]; then
  "$root/tests/install/test.sh" "$root/build"
fi
