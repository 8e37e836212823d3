# Shared helpers of tests/bench/run.sh: work directory, teardown, timing,
# verification and result rows. Sourced, not run.

log() { echo "[bench $(date +%H:%M:%S)] $*" >&2; }
die() { log "error: $*"; exit 1; }

REPORT() { python3 "$BENCH_LIB/report.py" "$@"; }
jstr() { python3 -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$1"; }

# Background processes this run started (pids), stopped at exit.
BG_PIDS=()

# Removes work directories of earlier runs whose harness died (SIGKILL leaves
# no trap behind): /tmp/lhbench.<pid>.* with <pid> no longer running, unless
# the run kept it (LONGHAUL_BENCH_KEEP).
cleanup_stale_workdirs() {
  local d pid
  for d in "$BENCH_TMP_PARENT"/lhbench.*; do
    [[ -d "$d" ]] || continue
    pid=${d##*/lhbench.}
    pid=${pid%%.*}
    [[ "$pid" =~ ^[0-9]+$ ]] || continue
    # A run with LONGHAUL_BENCH_KEEP left its directory on purpose.
    [[ -e "$d/.kept" ]] && continue
    if ! kill -0 "$pid" 2>/dev/null; then
      rm -rf "$d"
    fi
  done
}

teardown() {
  local rc=$?
  trap - EXIT INT TERM
  local p
  for p in "${BG_PIDS[@]}"; do
    kill -TERM "$p" 2>/dev/null
  done
  link_down
  for p in "${BG_PIDS[@]}"; do
    wait "$p" 2>/dev/null
  done
  if [[ -n "${WORK:-}" && -d "$WORK" ]]; then
    if [[ -n "${LONGHAUL_BENCH_KEEP:-}" ]]; then
      touch "$WORK/.kept"
      log "kept $WORK"
    else
      rm -rf "$WORK"
    fi
  fi
  exit "$rc"
}

# Seconds as a decimal from a `times` field like 1m2.345s.
_tsec() { awk -v t="$1" 'BEGIN { split(t, a, "m"); sub("s", "", a[2]); print a[1] * 60 + a[2] }'; }

# measure NAME CMD...: runs CMD with stdout/stderr in $WORK/NAME.out/.err and
# sets M_RC, M_SECONDS (wall) and M_CPU (user + system of CMD and everything
# it waited for).
measure() {
  local name=${1//[^A-Za-z0-9._-]/_}
  shift
  local t0 t1 tl
  t0=$(date +%s%N)
  tl=$({
    "$@" >"$WORK/$name.out" 2>"$WORK/$name.err"
    echo "rc $?"
    times
  })
  t1=$(date +%s%N)
  M_RC=$(awk '/^rc / { print $2 }' <<<"$tl")
  local user sys
  read -r user sys < <(tail -1 <<<"$tl")
  M_CPU=$(awk -v u="$(_tsec "$user")" -v s="$(_tsec "$sys")" 'BEGIN { printf "%.3f", u + s }')
  M_SECONDS=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", (b - a) / 1e9 }')
}

# CPU seconds used so far by PID and the children it has reaped.
proc_cpu() {
  local tck
  tck=$(getconf CLK_TCK)
  awk -v t="$tck" '{ sub(/.*\) /, ""); print ($12 + $13 + $14 + $15) / t }' "/proc/$1/stat" 2>/dev/null || echo 0
}

# CPU seconds (utime + stime) used so far by every thread of PID, io_uring
# workers included (they are threads of the process), not its children.
proc_cpu_threads() {
  local tck
  tck=$(getconf CLK_TCK)
  awk -v t="$tck" '{ sub(/.*\) /, ""); printf "%.2f\n", ($12 + $13) / t }' "/proc/$1/stat" 2>/dev/null || echo 0
}

# per_gib SECONDS BYTES: SECONDS per GiB of BYTES.
per_gib() { awk -v s="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", s * 1073741824 / b; else print "null" }'; }

# Waits until PID has no children (a server whose sessions have ended and
# been reaped, so its cumulative CPU includes them).
wait_no_children() {
  local i
  for ((i = 0; i < 50; i++)); do
    [[ -z "$(ps -o pid= --ppid "$1" 2>/dev/null)" ]] && return 0
    sleep 0.1
  done
}

add() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a + b }'; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a - b }'; }
mbit() { awk -v b="$1" -v s="$2" 'BEGIN { if (s > 0) printf "%.1f", b * 8 / s / 1e6; else print 0 }'; }

# digest_tree DIR OUT: "sha256  ./relative/path" of every file, sorted by path.
digest_tree() {
  (cd "$1" && find . -type f ! -path './.longhaul/*' -print0 |
    xargs -0 -r -n 256 -P 2 sha256sum | sort -k2) >"$2"
}

# verify_tree DIR: compares DIR with the source digest; prints true/false.
verify_tree() {
  local dir=$1 tag
  tag=$(basename "$dir")
  if [[ ! -d "$dir" ]]; then
    echo false
    return
  fi
  digest_tree "$dir" "$WORK/digest.$tag"
  # Every source file must be there with the same digest. Files the source
  # does not have (e.g. a temp file of a killed receiver) are reported, not
  # counted against the copy.
  local extra
  extra=$(awk 'NR == FNR { want[$2] = 1; next } !($2 in want)' "$WORK/digest.src" "$WORK/digest.$tag" | wc -l)
  [[ "$extra" -gt 0 ]] && log "$tag: $extra extra file(s) at the destination"
  awk 'NR == FNR { want[$2] = 1; next } ($2 in want)' "$WORK/digest.src" "$WORK/digest.$tag" >"$WORK/digest.$tag.common"
  if cmp -s "$WORK/digest.src" "$WORK/digest.$tag.common"; then
    echo true
  else
    log "$tag: destination differs from the source ($(diff "$WORK/digest.src" "$WORK/digest.$tag" | grep -c '^[<>]') lines differ)"
    echo false
  fi
}

tree_bytes() { du -sb --apparent-size "$1" | awk '{ print $1 }'; }
tree_files() { find "$1" -type f | wc -l; }

# Emulator counters around each row: link_mark before, row_counters after.
link_mark() { link_stats >"$WORK/emu.before" 2>/dev/null || rm -f "$WORK/emu.before"; }
row_counters() {
  if [[ -f "$WORK/emu.before" ]] && link_stats >"$WORK/emu.after" 2>/dev/null; then
    REPORT delta "$WORK/emu.before" "$WORK/emu.after"
  else
    echo null
  fi
}

# result TOOL BYTES SECONDS CPU VERIFIED [key=json ...]
result() {
  local tool=$1 bytes=$2 secs=$3 cpu=$4 verified=$5
  shift 5
  REPORT row "$WORK/rows.jsonl" "tool=$(jstr "$tool")" \
    "goodput_mbit=$(mbit "$bytes" "$secs")" "seconds=$secs" "cpu_seconds=$cpu" \
    "bytes=$bytes" "verified=$verified" "link_counters=$(row_counters)" "$@"
  log "$tool: $(mbit "$bytes" "$secs") Mbit/s, ${secs}s, cpu ${cpu}s, verified=$verified"
}

# result_error TOOL REASON
result_error() {
  REPORT row "$WORK/rows.jsonl" "tool=$(jstr "$1")" "error=$(jstr "$2")"
  log "$1: error: $2"
}

# extra KEY JSON: a scenario-level figure (share, jain, ideal_seconds...).
extra() {
  python3 - "$WORK/extra.json" "$1" "$2" <<'PY'
import json, sys
path, key, value = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
try:
    obj = json.load(open(path))
except (OSError, ValueError):
    obj = {}
obj[key] = value
json.dump(obj, open(path, "w"))
PY
}
