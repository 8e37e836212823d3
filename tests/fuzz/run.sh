#!/usr/bin/env bash
# Fuzzes every target in tests/fuzz/ for SECONDS each, with libFuzzer.
#   tests/fuzz/run.sh SECONDS [TARGET...]      e.g. tests/fuzz/run.sh 600 config_fuzz
# Configures a clang build of its own (LONGHAUL_FUZZ_BUILD, default
# build-fuzz/ at the top of the repository) and builds only the fuzz targets.
# New inputs go to BUILD/fuzz-corpus/TARGET (the seeds in tests/fuzz/corpus
# are read, never written); a crash leaves its input in
# BUILD/fuzz-artifacts/TARGET/ and makes the script exit 1. Exit 77 (ctest:
# skipped) when clang is missing.
set -euo pipefail
if [ $# -lt 1 ] || ! [[ $1 =~ ^[0-9]+$ ]]; then
  echo "usage: $0 SECONDS [TARGET...]" >&2
  exit 2
fi
seconds=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${LONGHAUL_FUZZ_BUILD:-$root/build-fuzz}

if ! command -v clang++ >/dev/null || ! command -v clang >/dev/null; then
  echo "fuzz: clang is not installed; skipping" >&2
  exit 77
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in "$here"/*_fuzz.cc; do targets+=("$(basename "$f" .cc)"); done
fi

t0=$(date +%s)
mkdir -p "$build"
if [ ! -f "$build/build.ninja" ]; then
  # Line tables only (-g1): a crash's stack still names file and line.
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
    -DLONGHAUL_WERROR=OFF -DLONGHAUL_BUILD_BENCHMARKS=OFF >"$build/configure.log" 2>&1 || {
    cat "$build/configure.log" >&2
    exit 1
  }
fi
nice -n 5 ninja -C "$build" -j"${LONGHAUL_FUZZ_JOBS:-2}" "${targets[@]}"
echo "fuzz: clang build of ${targets[*]} took $(($(date +%s) - t0)) s"

status=0
for t in "${targets[@]}"; do
  seeds=$here/corpus/${t%_fuzz}
  work=$build/fuzz-corpus/$t
  artifacts=$build/fuzz-artifacts/$t
  log=$build/fuzz-logs/$t.log
  mkdir -p "$work" "$artifacts" "$(dirname "$log")"
  start=$(date +%s)
  set +e
  "$build/bin/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" "$work" "$seeds" >"$log" 2>&1
  rc=$?
  set -e
  ran=$(($(date +%s) - start))
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  if [ $rc -eq 0 ]; then
    echo "fuzz: $t ran ${ran} s, ${execs:-?} executions, ${cov:-cov: ?}, corpus $(find "$work" -type f | wc -l) inputs: no crash"
  else
    status=1
    echo "fuzz: $t FAILED after ${ran} s (exit $rc); input(s): $(find "$artifacts" -type f | tr '\n' ' ')"
    grep -m1 -A12 'ERROR\|contract broken\|deadly signal' "$log" || tail -n 20 "$log"
  fi
done
exit $status
