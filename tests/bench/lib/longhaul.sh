# longhaul's own rows: two daemons (one per site namespace) and `longhaul cp`.
# Sourced by run.sh. Written against the contract of issue 4:
#   deploy/pki.sh DIR SITE...; longhauld --config FILE (YAML);
#   longhaul --daemon unix:SOCK cp SRC... site-b:/ckpt/PATH --wait --json
#     -> {"id","state","bytes","files","seconds","goodput_mbit","resent_bytes"}

LONGHAULD="$BIN_DIR/longhauld"
LONGHAUL="$BIN_DIR/longhaul"
LH_PIDS=()
LH_ERROR=""

# Why longhaul cannot run here, or empty.
longhaul_missing() {
  if [[ ! -x "$LONGHAULD" ]]; then
    echo "longhauld not built"
  elif [[ ! -x "$LONGHAUL" ]]; then
    echo "longhaul CLI not built"
  elif [[ ! -x "$REPO/deploy/pki.sh" && ! -f "$REPO/deploy/pki.sh" ]]; then
    echo "deploy/pki.sh missing"
  fi
}

# lh_config SITE LISTEN PEER_SITE PEER_ADDR EXPORT_DIR: LH_EXTRA_CONFIG, if set, is
# appended (top-level YAML keys the config does not have yet).
lh_config() {
  local site=$1 listen=$2 peer=$3 peer_addr=$4 export=$5
  local d="$WORK/lh/$site"
  mkdir -p "$d/state" "$export"
  cat >"$d/longhauld.yaml" <<CFG
site: $site
listen: $listen
control_socket: $d/control.sock
state_dir: $d/state
tls: {ca: $WORK/lh/pki/ca.pem, cert: $WORK/lh/pki/$site.pem, key: $WORK/lh/pki/$site.key}
exports: [{name: ckpt, path: $export, writers: [$peer]}, {name: local, path: $WORK}]  # local: what the rows send
peers: [{site: $peer, address: $peer_addr}]
link: {bandwidth: $LH_BANDWIDTH, rtt: $LH_RTT${LH_CONGESTION_CONTROL:+, congestion_control: $LH_CONGESTION_CONTROL}}
metrics: {listen: "127.0.0.1:0"}
${LH_EXTRA_CONFIG:-}
CFG
}

# lh_start SITE NS: starts the site's daemon inside NS; sets LH_PID_<site>.
lh_start() {
  local site=$1 ns=$2 d="$WORK/lh/$1"
  rm -f "$d/control.sock"
  ip netns exec "$ns" "$LONGHAULD" --config "$d/longhauld.yaml" >>"$d/longhauld.log" 2>&1 &
  local pid=$!
  LH_PIDS+=("$pid")
  BG_PIDS+=("$pid")
  printf -v "LH_PID_${site//-/_}" '%s' "$pid"
  local i
  for ((i = 0; i < 100; i++)); do
    [[ -S "$d/control.sock" ]] && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  LH_ERROR="longhauld for $site did not come up: $(tail -c 300 "$d/longhauld.log" | tr '\n' ' ')"
  return 1
}

# Sets up PKI, configs and both daemons; on failure LH_ERROR says why.
longhaul_up() {
  LH_ERROR=$(longhaul_missing)
  [[ -z "$LH_ERROR" ]] || return 1
  mkdir -p "$WORK/lh"
  if ! bash "$REPO/deploy/pki.sh" "$WORK/lh/pki" site-a site-b >"$WORK/lh/pki.log" 2>&1; then
    LH_ERROR="deploy/pki.sh failed: $(tail -c 300 "$WORK/lh/pki.log" | tr '\n' ' ')"
    return 1
  fi
  local port_a=7700 port_b=7700
  if [[ "$NS_SRC" == "$NS_DST" ]]; then port_b=7701; fi
  LH_EXPORT_A="$WORK/dst/lh-a"
  LH_EXPORT_B="$WORK/dst/lh-b"
  lh_config site-a "$ADDR_SRC:$port_a" site-b "$ADDR_DST:$port_b" "$LH_EXPORT_A"
  lh_config site-b "$ADDR_DST:$port_b" site-a "$ADDR_SRC:$port_a" "$LH_EXPORT_B"
  lh_start site-a "$NS_SRC" || return 1
  lh_start site-b "$NS_DST" || return 1
  log "longhauld up at site-a ($NS_SRC) and site-b ($NS_DST)"
}

lh_cli() { "$LONGHAUL" --daemon "unix:$WORK/lh/$1/control.sock" "${@:2}"; }

# The directory a `cp SRC site-b:/ckpt/NAME` produced: NAME itself, or
# NAME/<basename SRC> if the copy kept the source directory's name.
lh_dest_tree() {
  local base=$1
  if [[ -d "$base/$(basename "$SRC")" && ! -e "$SRC/$(basename "$SRC")" ]]; then
    echo "$base/$(basename "$SRC")"
  else
    echo "$base"
  fi
}

# longhaul_row TOOL [CLI ARGS...]: one `longhaul cp` of the data set a -> b.
longhaul_row() {
  local tool=$1
  shift
  if [[ -n "$LH_ERROR" ]]; then
    result_error "$tool" "$LH_ERROR"
    return
  fi
  local name="run-${tool//\//-}"
  local dest="$LH_EXPORT_B/$name"
  rm -rf "$dest"
  link_mark
  local c0 c1 tx0 tx1 rx0 rx1
  c0=$(add "$(proc_cpu "$LH_PID_site_a")" "$(proc_cpu "$LH_PID_site_b")")
  tx0=$(proc_cpu_threads "$LH_PID_site_a")
  rx0=$(proc_cpu_threads "$LH_PID_site_b")
  measure longhaul lh_cli site-a cp "$SRC" "site-b:/ckpt/$name" --wait --json "$@"
  tx1=$(proc_cpu_threads "$LH_PID_site_a")
  rx1=$(proc_cpu_threads "$LH_PID_site_b")
  c1=$(add "$(proc_cpu "$LH_PID_site_a")" "$(proc_cpu "$LH_PID_site_b")")
  if [[ "$M_RC" != 0 ]]; then
    local why
    why=$(tail -c 300 "$WORK/longhaul.err" | tr '\n' ' ')
    [[ -n "$why" ]] || why=$(tail -c 300 "$WORK/longhaul.out" | tr '\n' ' ')
    result_error "$tool" "longhaul cp exit $M_RC: $why"
    return
  fi
  local secs resent
  secs=$(REPORT get "$WORK/longhaul.out" seconds)
  resent=$(REPORT get "$WORK/longhaul.out" resent_bytes)
  [[ -n "$secs" ]] || secs=$M_SECONDS
  local verified
  verified=$(verify_tree "$(lh_dest_tree "$dest")")
  local tx rx
  tx=$(sub "$tx1" "$tx0")
  rx=$(sub "$rx1" "$rx0")
  result "$tool" "$DATA_BYTES" "$secs" "$(add "$M_CPU" "$(sub "$c1" "$c0")")" "$verified" \
    "files=$DATA_FILES" "resent_bytes=${resent:-null}" "wall_seconds=$M_SECONDS" \
    "cpu_seconds_sender=$tx" "cpu_seconds_receiver=$rx" \
    "cpu_seconds_per_gib_sender=$(per_gib "$tx" "$DATA_BYTES")" \
    "cpu_seconds_per_gib_receiver=$(per_gib "$rx" "$DATA_BYTES")"
  rm -rf "$dest"
}

# longhaul_resume_row TOOL [CLI ARGS...]: one `longhaul cp` of the data set a -> b, with
# LH_RESUME_STREAMS streams [8] of LH_RESUME_CHUNK-byte chunks [16 MiB], whose receiving
# daemon is SIGKILLed once half the data is durable at the destination, and restarted; the
# transfer must resume and finish. resent_ratio: IP bytes the link carried a -> b over the bytes needed;
# resent_chunks_per_stream: the sender's resent bytes over streams x chunk size (at most 1).
longhaul_resume_row() {
  local tool=$1
  shift
  if [[ -n "$LH_ERROR" ]]; then
    result_error "$tool" "$LH_ERROR"
    return
  fi
  local name="run-resume-${tool//\//-}"
  local streams=${LH_RESUME_STREAMS:-8} chunk=${LH_RESUME_CHUNK:-$((16 << 20))}
  rm -rf "${LH_EXPORT_B:?}/$name"
  link_mark
  local t0 t1 tx0 rx0 rx_before_kill=0 rx_restarted=0
  tx0=$(proc_cpu_threads "$LH_PID_site_a")
  rx0=$(proc_cpu_threads "$LH_PID_site_b")
  t0=$(date +%s%N)
  lh_cli site-a cp "$SRC" "site-b:/ckpt/$name" --wait --json \
    --streams "$streams" --chunk-size "${chunk}B" "$@" \
    >"$WORK/lh-resume.out" 2>"$WORK/lh-resume.err" &
  local cp=$!
  local killed=0 durable
  # Polled only until the kill, so the rest of the transfer runs without the CLI beside it.
  while [[ $killed == 0 ]] && kill -0 "$cp" 2>/dev/null; do
    # Half of the data acknowledged as durable, by the sender's count. (Not the staged files'
    # size: the destination sizes them in full when the transfer opens.)
    durable=$(lh_cli site-a ls --json 2>/dev/null | grep -o '"bytes_done": [0-9]*' | awk '{ s += $2 } END { print s + 0 }')
    if [[ "$durable" -ge $((DATA_BYTES / 2)) ]]; then
      rx_before_kill=$(proc_cpu_threads "$LH_PID_site_b")
      kill -KILL "$LH_PID_site_b"
      wait "$LH_PID_site_b" 2>/dev/null
      killed=1
      lh_start site-b "$NS_DST" || { result_error "$tool" "$LH_ERROR"; return; }
      rx_restarted=$(proc_cpu_threads "$LH_PID_site_b")
    else
      sleep 0.1
    fi
  done
  wait "$cp"
  local rc=$?
  t1=$(date +%s%N)
  local tx rx
  tx=$(sub "$(proc_cpu_threads "$LH_PID_site_a")" "$tx0")
  # The receiver's CPU is that of both its processes: the killed one's up to its last
  # sample before the SIGKILL, and the restarted one's from when it is up.
  if [[ $killed == 1 ]]; then
    rx=$(add "$(sub "$rx_before_kill" "$rx0")" "$(sub "$(proc_cpu_threads "$LH_PID_site_b")" "$rx_restarted")")
  else
    rx=$(sub "$(proc_cpu_threads "$LH_PID_site_b")" "$rx0")
  fi
  local lc
  lc=$(row_counters)
  if [[ $rc != 0 ]]; then
    result_error "$tool" "cp failed after the restart (exit $rc): $(tail -c 300 "$WORK/lh-resume.err")"
    return
  fi
  local wire secs verified resent
  wire=$(python3 -c 'import json,sys; c=json.loads(sys.argv[1]); print(c["a2b"]["forwarded_bytes"] if c else 0)' "$lc")
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", (b - a) / 1e9 }')
  verified=$(verify_tree "$(lh_dest_tree "$LH_EXPORT_B/$name")")
  resent=$(REPORT get "$WORK/lh-resume.out" resent_bytes)
  REPORT row "$WORK/rows.jsonl" "tool=$(jstr "$tool")" "bytes=$DATA_BYTES" "seconds=$secs" \
    "goodput_mbit=$(mbit "$DATA_BYTES" "$secs")" "cpu_seconds=null" "verified=$verified" \
    "link_counters=$lc" "killed_at_half=$([[ $killed == 1 ]] && echo true || echo false)" \
    "resent_bytes=${resent:-null}" \
    "resent_chunks_per_stream=$(awk -v r="${resent:-0}" -v s="$streams" -v c="$chunk" 'BEGIN { printf "%.3f", r / (s * c) }')" \
    "cpu_seconds_sender=$tx" "cpu_seconds_receiver=$rx" \
    "cpu_seconds_per_gib_sender=$(per_gib "$tx" "$DATA_BYTES")" \
    "cpu_seconds_per_gib_receiver=$(per_gib "$rx" "$DATA_BYTES")" \
    "resent_ratio=$(awk -v w="$wire" -v n="$DATA_BYTES" 'BEGIN { printf "%.4f", w / n }')"
  log "$tool (resumed): $(mbit "$DATA_BYTES" "$secs") Mbit/s, ${secs}s, killed=$killed, verified=$verified"
  rm -rf "${LH_EXPORT_B:?}/$name"
}

# The udp transport row (issue 5): runs if the CLI accepts --transport udp,
# and is listed with the CLI's refusal otherwise.
longhaul_udp_row() { longhaul_row longhaul-udp --transport udp; }

# longhaul_reconfigure YAML: appends YAML (a top-level key the configs do not have yet) to both
# daemons' configs and restarts them; on failure LH_ERROR says why.
longhaul_reconfigure() {
  local site pid
  for site in site-a site-b; do printf '%s\n' "$1" >>"$WORK/lh/$site/longhauld.yaml"; done
  for pid in "$LH_PID_site_a" "$LH_PID_site_b"; do
    kill -TERM "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  lh_start site-a "$NS_SRC" || return 1
  lh_start site-b "$NS_DST" || return 1
  log "longhauld restarted with: $1"
}

# --- the exchange scenario: the ExchangeGroup API through the Python binding --
LH_PYTHON=/usr/bin/python3
LH_PYPATH="${LONGHAUL_PYTHONPATH:-$(cd "$BIN_DIR/.." 2>/dev/null && pwd)/python}"
lh_py() { env PYTHONPATH="$LH_PYPATH" PYTHONDONTWRITEBYTECODE=1 "$LH_PYTHON" "$BENCH_LIB/exchange_bench.py" "$@"; }

# lh_copy_loop_start: keeps a 2 GiB `cp` site-a -> site-b running (one after
# another) until lh_copy_loop_stop; returns once the first one moves data.
lh_copy_loop_start() {
  rm -f "$WORK/copy.stop" "$WORK/copy.ready" "$WORK/copies.json"
  export -f lh_py
  export LH_PYPATH LH_PYTHON BENCH_LIB
  in_src bash -c 'lh_py "$@"' _ copy-loop --daemon "unix:$WORK/lh/site-a/control.sock" \
    --source "$WORK/ckpt/ckpt.bin" --dest "site-b:/ckpt/copy" --stop-file "$WORK/copy.stop" \
    --ready-file "$WORK/copy.ready" --out "$WORK/copies.json" >"$WORK/copy.log" 2>&1 &
  LH_COPY_PID=$!
  BG_PIDS+=("$LH_COPY_PID")
  local i
  for ((i = 0; i < 600; i++)); do
    [[ -e "$WORK/copy.ready" ]] && break
    kill -0 "$LH_COPY_PID" 2>/dev/null || break
    sleep 0.1
  done
  log "checkpoint copy loop running: $(cat "$WORK/copy.log" 2>/dev/null | tail -c 200)"
}

# lh_copy_loop_stop: cancels the copy in flight; adds a row for the copies
# (the first completed one is checked against the source digest).
lh_copy_loop_stop() {
  touch "$WORK/copy.stop"
  wait "$LH_COPY_PID" 2>/dev/null
  local summary
  summary=$(python3 - "$WORK/copies.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["copies"]
done = [x for x in c if x["state"] == "COMPLETED"]
print(len(c), len(done), done[0]["dest"].split("/ckpt/", 1)[1] if done else "",
      "%.3f" % (done[0]["end"] - done[0]["submitted"]) if done else 0)
PY
  )
  local n ncomplete first secs
  read -r n ncomplete first secs <<<"$summary"
  local verified=false
  if [[ -n "$first" ]]; then
    local got
    got=$(find "$LH_EXPORT_B/$first" -type f 2>/dev/null | head -1)
    [[ -n "$got" && "$(sha256sum <"$got" | awk '{ print $1 }')" == "$(cat "$WORK/ckpt.sha256")" ]] && verified=true
    result "longhaul cp (concurrent checkpoint copy)" "$(stat -c %s "$WORK/ckpt/ckpt.bin")" "$secs" null "$verified" \
      "note=\"$ncomplete of $n copies completed during the exchange rounds (the last one cancelled); the first one's time and digest\""
  else
    result_error "longhaul cp (concurrent checkpoint copy)" "no copy completed: $(tail -c 300 "$WORK/copy.log" | tr '\n' ' ')"
  fi
  rm -rf "$LH_EXPORT_B"/copy-*
}

# lh_exchange_rows COND BIG ROUNDS IDEAL_BIG IDEAL_SMALL RTT_S [raw]: both
# sites run exchange_bench.py in their namespaces; one row per size. With
# "raw", the anchor: the same rounds over plain TCP, no daemon.
lh_exchange_rows() {
  local cond=$1 big=$2 rounds=$3 ideal_big=$4 ideal_small=$5 rtt_s=$6 mode=${7:-run}
  local tag=$cond
  [[ $mode == raw ]] && tag="raw-$cond"
  local out_a="$WORK/xbench-$tag-site-a.json" out_b="$WORK/xbench-$tag-site-b.json"
  local common=(--size "big=$big" --size small=4096 --rounds "$rounds")
  local args_a args_b
  if [[ $mode == raw ]]; then
    local port
    port=$(free_port)
    args_a=(raw --connect "$ADDR_DST:$port" --site site-a --peer site-b)
    args_b=(raw --listen "$ADDR_DST:$port" --site site-b --peer site-a)
  else
    args_a=(run --group "bench-$cond" --daemon "unix:$WORK/lh/site-a/control.sock" --site site-a
            --peer site-b --daemon-pid "$LH_PID_site_a")
    args_b=(run --group "bench-$cond" --daemon "unix:$WORK/lh/site-b/control.sock" --site site-b
            --peer site-a --daemon-pid "$LH_PID_site_b")
  fi
  export -f lh_py
  export LH_PYPATH LH_PYTHON BENCH_LIB
  log "exchange rounds ($tag): $rounds x $big bytes and $rounds x 4096 bytes, both directions"
  timeout --kill-after=10 "$TOOL_TIMEOUT" ip netns exec "$NS_DST" bash -c 'lh_py "$@"' _ \
    "${args_b[@]}" --out "$out_b" "${common[@]}" >"$WORK/xbench-$tag-b.log" 2>&1 &
  local pb=$!
  timeout --kill-after=10 "$TOOL_TIMEOUT" ip netns exec "$NS_SRC" bash -c 'lh_py "$@"' _ \
    "${args_a[@]}" --out "$out_a" "${common[@]}" >"$WORK/xbench-$tag-a.log" 2>&1
  local ra=$?
  wait "$pb"
  local rb=$?
  local label=""
  [[ $cond == copy ]] && label=" + 2 GiB cp"
  local tool="longhaul exchange"
  [[ $mode == raw ]] && tool="tcp (raw sockets, no TLS) exchange"
  cond=$tag
  if [[ $ra != 0 || $rb != 0 ]]; then
    local why
    why=$(tail -c 300 "$WORK/xbench-$cond-a.log" "$WORK/xbench-$cond-b.log" | tr '\n' ' ')
    result_error "$tool big$label" "exchange_bench.py failed (exit $ra/$rb): $why"
    result_error "$tool small$label" "exchange_bench.py failed (exit $ra/$rb): $why"
    return
  fi
  local copies=()
  [[ -n $label ]] && copies=(--copies "$WORK/copies.json")
  lh_py merge "$out_a" "$out_b" "${copies[@]}" >"$WORK/xbench-$cond.json" || {
    result_error "$tool big$label" "merge failed"
    return
  }
  local kind
  for kind in big small; do
    python3 - "$WORK/xbench-$cond.json" "$kind" "$ideal_big" "$ideal_small" "$rtt_s" >"$WORK/xrow.args" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
kind, ideal_big, ideal_small, rtt = sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
r = s[kind]
ideal = ideal_big if kind == "big" else ideal_small
limit = 1.15 * ideal if kind == "big" else rtt + 0.002
med = r["median_seconds"]
print(json.dumps({
    "seconds": round(med, 5), "bytes": r["bytes"], "cpu": round(r["cpu_seconds"], 3),
    "verified": r["verified"],
    "extra": {"ideal_seconds": ideal, "ratio_to_ideal": round(med / ideal, 4),
              "target_seconds": round(limit, 5), "meets_target": med <= limit,
              "min_seconds": round(r["min_seconds"], 5), "p90_seconds": round(r["p90_seconds"], 5),
              "max_seconds": round(r["max_seconds"], 5), "rounds": r["rounds"],
              "rounds_counted": r["rounds_counted"], "late_starts": r["late_starts"],
              "round_seconds": r["seconds"]}}))
PY
    local seconds bytes cpu verified extra_kv=()
    seconds=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["seconds"])' "$WORK/xrow.args")
    bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bytes"])' "$WORK/xrow.args")
    cpu=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["cpu"])' "$WORK/xrow.args")
    verified=$(python3 -c 'import json,sys; print(str(json.load(open(sys.argv[1]))["verified"]).lower())' "$WORK/xrow.args")
    mapfile -t extra_kv < <(python3 -c 'import json,sys
for k, v in json.load(open(sys.argv[1]))["extra"].items(): print(k + "=" + json.dumps(v))' "$WORK/xrow.args")
    local note="ExchangeGroup send+recv both directions at once (Python binding); median of rounds; cpu: both daemons + clients"
    [[ $mode == raw ]] && note="anchor: one plain TCP connection (kernel BBR, 10 MB buffers), both directions at once, same rounds; cpu: the two clients"
    [[ -n $label ]] && note="$note; only rounds run wholly while a copy moved data are counted (cpu includes the copy)"
    result "$tool $kind$label" "$bytes" "$seconds" "$cpu" "$verified" "${extra_kv[@]}" "note=$(jstr "$note")"
  done
}

# --- the allreduce and fanout scenarios: N daemons on the star, one per site -------------
# Sites are site-1 .. site-N (site-K in the star's namespace K); each lists
# every other as a peer and as a writer of its export `ckpt`
# ($WORK/dst/site-K; `fanout`). LH_EXTRA_CONFIG is appended to each config.
LH_STAR_SITES=()

# longhaul_star_up N: PKI, configs and the N daemons; on failure LH_ERROR says why.
longhaul_star_up() {
  local n=$1 k j
  LH_ERROR=$(longhaul_missing)
  [[ -z "$LH_ERROR" ]] || return 1
  LH_STAR_SITES=()
  for ((k = 1; k <= n; k++)); do LH_STAR_SITES+=("site-$k"); done
  rm -rf "$WORK/lh"
  mkdir -p "$WORK/lh"
  if ! bash "$REPO/deploy/pki.sh" "$WORK/lh/pki" "${LH_STAR_SITES[@]}" >"$WORK/lh/pki.log" 2>&1; then
    LH_ERROR="deploy/pki.sh failed: $(tail -c 300 "$WORK/lh/pki.log" | tr '\n' ' ')"
    return 1
  fi
  for ((k = 1; k <= n; k++)); do
    local site=site-$k d="$WORK/lh/site-$k" peers="" writers=""
    for ((j = 1; j <= n; j++)); do
      [[ $j == "$k" ]] && continue
      peers+="${peers:+, }{site: site-$j, address: ${STAR_ADDR[$j]}:7700}"
      writers+="${writers:+, }site-$j"
    done
    mkdir -p "$d/state" "$WORK/dst/$site"
    cat >"$d/longhauld.yaml" <<CFG
site: $site
listen: ${STAR_ADDR[$k]}:7700
control_socket: $d/control.sock
state_dir: $d/state
tls: {ca: $WORK/lh/pki/ca.pem, cert: $WORK/lh/pki/$site.pem, key: $WORK/lh/pki/$site.key}
exports: [{name: ckpt, path: $WORK/dst/$site, writers: [$writers]}, {name: local, path: $WORK}]
peers: [$peers]
link: {bandwidth: $LH_BANDWIDTH, rtt: $LH_RTT${LH_CONGESTION_CONTROL:+, congestion_control: $LH_CONGESTION_CONTROL}}
metrics: {listen: "127.0.0.1:0"}
${LH_EXTRA_CONFIG:-}
CFG
  done
  for ((k = 1; k <= n; k++)); do
    lh_start "site-$k" "${STAR_NS[$k]}" || return 1
  done
  log "longhauld up at ${LH_STAR_SITES[*]}${LH_EXTRA_CONFIG:+ with: $LH_EXTRA_CONFIG}"
}

# longhaul_star_down: stops the star's daemons (SIGTERM, then waits).
longhaul_star_down() {
  local site var
  for site in "${LH_STAR_SITES[@]}"; do
    var=LH_PID_${site//-/_}
    [[ -n "${!var:-}" ]] || continue
    kill -TERM "${!var}" 2>/dev/null
    wait "${!var}" 2>/dev/null
    printf -v "$var" '%s' ""
  done
}

lh_ar_py() { env PYTHONPATH="$LH_PYPATH" PYTHONDONTWRITEBYTECODE=1 "$LH_PYTHON" "$BENCH_LIB/allreduce_bench.py" "$@"; }

# lh_allreduce_row TOOL N BYTES ROUNDS PERIOD IDEAL REF: every site of the star
# runs allreduce_bench.py against its own daemon at once; one row with the
# median round, verified against the reference digests in REF.
lh_allreduce_row() {
  local tool=$1 n=$2 bytes=$3 rounds=$4 period=$5 ideal=$6 ref=$7
  local tag="n$n-${tool//[^A-Za-z0-9]/_}" sites k
  sites=$(IFS=,; echo "${LH_STAR_SITES[*]}")
  if [[ -n "$LH_ERROR" ]]; then
    result_error "$tool" "$LH_ERROR"
    return
  fi
  export -f lh_ar_py
  export LH_PYPATH LH_PYTHON BENCH_LIB
  log "$tool: $rounds rounds of a $bytes-byte all-reduce at $n sites, one every ${period}s"
  link_mark
  local load0 load1 host0 host1
  load0=$(cut -d' ' -f1 /proc/loadavg)
  host0=$(head -1 /proc/stat)
  local pids=() outs=() cpu0=() cpu1=()
  for ((k = 1; k <= n; k++)); do
    local var=LH_PID_site_$k
    cpu0+=("$(proc_cpu_threads "${!var}")")
    outs+=("$WORK/ar-$tag-site-$k.json")
    timeout --kill-after=10 "$TOOL_TIMEOUT" ip netns exec "${STAR_NS[$k]}" bash -c 'lh_ar_py "$@"' _ \
      run --daemon "unix:$WORK/lh/site-$k/control.sock" --group "bench-$tag" --site "site-$k" \
      --sites "$sites" --bytes "$bytes" --rounds "$rounds" --period "$period" \
      --daemon-pid "${!var}" --out "$WORK/ar-$tag-site-$k.json" >"$WORK/ar-$tag-site-$k.log" 2>&1 &
    pids+=($!)
    BG_PIDS+=($!)
  done
  local rcs=() p failed=0
  for p in "${pids[@]}"; do
    wait "$p"
    local rc=$?
    rcs+=("$rc")
    [[ $rc == 0 ]] || failed=1
  done
  local counters
  counters=$(row_counters)
  load1=$(cut -d' ' -f1 /proc/loadavg)
  host1=$(head -1 /proc/stat)
  # The whole machine's CPU over the row (other work shares it): busy share of
  # all cores, and the hypervisor's steal.
  local host
  host=$(awk -v a="$host0" -v b="$host1" 'BEGIN {
    n = split(a, x, " "); split(b, y, " ")
    for (i = 2; i <= n; i++) { d = y[i] - x[i]; t += d; if (i == 5 || i == 6) idle += d; if (i == 9) st = d }
    printf "{\"busy\": %.3f, \"steal\": %.3f, \"load_before\": %s, \"load_after\": %s}", (t - idle) / t, st / t, "'"$load0"'", "'"$load1"'" }')
  for ((k = 1; k <= n; k++)); do
    local var=LH_PID_site_$k
    cpu1+=("$(proc_cpu_threads "${!var}")")
  done
  if [[ $failed == 1 ]]; then
    local why
    why=$(tail -q -c 200 "$WORK"/ar-"$tag"-site-*.log | tr '\n' ' ')
    result_error "$tool" "allreduce_bench.py failed (exit ${rcs[*]}): $why"
    return
  fi
  if ! lh_ar_py merge --reference "$ref" "${outs[@]}" >"$WORK/ar-$tag.json" 2>"$WORK/ar-$tag.err"; then
    result_error "$tool" "merge failed: $(tail -c 300 "$WORK/ar-$tag.err" | tr '\n' ' ')"
    return
  fi
  local daemons_cpu=0
  for ((k = 0; k < n; k++)); do daemons_cpu=$(add "$daemons_cpu" "$(sub "${cpu1[$k]}" "${cpu0[$k]}")"); done
  if ! python3 - "$WORK/ar-$tag.json" "$tool" "$n" "$bytes" "$ideal" "$daemons_cpu" "$counters" "$host" \
      >>"$WORK/rows.jsonl" <<'PY'; then
import json, os, sys
s = json.load(open(sys.argv[1]))
tool, n, size, ideal, dcpu = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
counters = json.loads(sys.argv[7] or "null")
med = s["median_seconds"]
row = {"tool": tool, "sites": n, "bytes": size, "seconds": round(med, 5),
       "median_seconds": round(med, 5), "ideal_seconds": round(ideal, 5),
       "ratio_to_ideal": round(med / ideal, 4), "target_seconds": round(1.25 * ideal, 5),
       "meets_target": med <= 1.25 * ideal,
       # Each site's own buffer through the all-reduce per round: size / median.
       "goodput_mbit": round(size * 8 / med / 1e6, 1),
       "cpu_seconds": round(s["cpu_seconds"], 3), "cpu_seconds_daemons": round(dcpu, 3),
       "verified": s["verified"], "link_counters": counters, "host_cpu": json.loads(sys.argv[8]),
       "link_bandwidth_config": os.environ.get("LH_BANDWIDTH", "")}
for k in ("min_seconds", "p90_seconds", "max_seconds"):
    row[k] = round(s[k], 5)
for k in ("rounds", "round_seconds", "late_starts", "bytes_sent_per_site", "warmup_seconds",
          "join_seconds"):
    row[k] = s[k]
if not s["verified"]:
    row["why_not_verified"] = s["why_not_verified"]
print(json.dumps(row))
print(f"{tool}: median {med:.4f}s, ideal {ideal:.4f}s, ratio {med / ideal:.3f}, "
      f"verified={s['verified']}", file=sys.stderr)
PY
    result_error "$tool" "summary failed"
  fi
}
