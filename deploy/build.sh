#!/usr/bin/env bash
# Installs dependencies if missing and builds longhaul into build/ at the
# repository root (binaries in build/bin). Shared by demo.sh and test.sh.
# LONGHAUL_BUILD_TYPE (default RelWithDebInfo) and LONGHAUL_WERROR (default ON
# in CI) tune it; extra arguments are passed to cmake --build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/deploy/install-deps.sh"
werror=${LONGHAUL_WERROR:-$([ -n "${CI:-}" ] && echo ON || echo OFF)}
# Debug info is line tables only (-g1): backtraces and sanitizer reports still
# name file and line, and the build takes about a quarter less CPU than with
# full -g. `cmake --preset dev` keeps full debug info for a debugger.
# ccache, where the machine has it, with its cache outside the clone
# (ccache's own default, ~/.cache/ccache); it is never required.
if command -v ccache >/dev/null; then
  export CMAKE_C_COMPILER_LAUNCHER=${CMAKE_C_COMPILER_LAUNCHER-ccache}
  export CMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER-ccache}
fi
cmake -S "$root" -B "$root/build" -G Ninja \
  -DCMAKE_BUILD_TYPE="${LONGHAUL_BUILD_TYPE:-RelWithDebInfo}" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  -DLONGHAUL_WERROR="$werror" >/dev/null
cmake --build "$root/build" -j "$(nproc)" "$@"
