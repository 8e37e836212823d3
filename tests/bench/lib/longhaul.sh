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

# lh_config SITE LISTEN PEER_SITE PEER_ADDR EXPORT_DIR
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
exports: [{name: ckpt, path: $export}]
peers: [{site: $peer, address: $peer_addr}]
link: {bandwidth: $LH_BANDWIDTH, rtt: $LH_RTT}
metrics: {listen: "127.0.0.1:0"}
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
  local c0 c1
  c0=$(add "$(proc_cpu "$LH_PID_site_a")" "$(proc_cpu "$LH_PID_site_b")")
  measure longhaul lh_cli site-a cp "$SRC" "site-b:/ckpt/$name" --wait --json "$@"
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
  result "$tool" "$DATA_BYTES" "$secs" "$(add "$M_CPU" "$(sub "$c1" "$c0")")" "$verified" \
    "files=$DATA_FILES" "resent_bytes=${resent:-null}" "wall_seconds=$M_SECONDS"
  rm -rf "$dest"
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
