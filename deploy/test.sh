#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs the
# whole ctest suite (unit, integration, sim, wan, fault, security, bench smoke).
# Extra arguments go to ctest, e.g. ./deploy/test.sh -L integration
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/deploy/build.sh"
cd "$root/build"
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"
