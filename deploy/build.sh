#!/usr/bin/env bash
# Installs dependencies if missing and builds longhaul into build/ at the
# repository root (binaries in build/bin). Shared by demo.sh and test.sh.
# LONGHAUL_BUILD_TYPE (default RelWithDebInfo) and LONGHAUL_WERROR (default ON
# in CI) tune it; extra arguments are passed to cmake --build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/deploy/install-deps.sh"
werror=${LONGHAUL_WERROR:-$([ -n "${CI:-}" ] && echo ON || echo OFF)}
cmake -S "$root" -B "$root/build" -G Ninja \
  -DCMAKE_BUILD_TYPE="${LONGHAUL_BUILD_TYPE:-RelWithDebInfo}" \
  -DLONGHAUL_WERROR="$werror" >/dev/null
cmake --build "$root/build" -j "$(nproc)" "$@"
