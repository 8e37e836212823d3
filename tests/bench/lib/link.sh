# The link of a scenario: longhaul-wanem between two namespaces, or, for
# `lan`, plain loopback inside one namespace. Sourced by run.sh.
#
# After link_up: NS_SRC / NS_DST (where senders and receivers run) and
# ADDR_SRC / ADDR_DST (their addresses).

WANEM_PID=""
LINK_CTL=""

# wanem_start ARGS...: starts longhaul-wanem with ARGS and this run's control
# socket, ready file and stats file; waits until it is ready and sources its
# ready file (LHW_* variables).
wanem_start() {
  [[ -x "$WANEM" ]] || die "no emulator at $WANEM (build longhaul-wanem first)"
  LINK_CTL="$WORK/wanem.sock"
  rm -f "$WORK/wanem.ready" "$LINK_CTL"
  "$WANEM" "$@" --control="$LINK_CTL" --ready-file="$WORK/wanem.ready" \
    --stats-json="$WORK/wanem.stats.json" >"$WORK/wanem.log" 2>&1 &
  WANEM_PID=$!
  local i
  for ((i = 0; i < 100; i++)); do
    [[ -s "$WORK/wanem.ready" ]] && break
    kill -0 "$WANEM_PID" 2>/dev/null || break
    sleep 0.1
  done
  [[ -s "$WORK/wanem.ready" ]] || { cat "$WORK/wanem.log" >&2; die "emulator did not come up"; }
  # shellcheck disable=SC1091
  . "$WORK/wanem.ready"
}

# link_up RATE DELAY LOSS MTU: RATE "0" means no emulation (loopback only).
link_up() {
  local rate=$1 delay=$2 loss=$3 mtu=$4
  local args=(--mtu="$mtu")
  if [[ "$rate" != 0 ]]; then
    args+=(--rate="$rate" --delay="$delay" --loss="$loss" --queue=bdp)
  fi
  wanem_start "${args[@]}"
  if [[ "$rate" == 0 ]]; then
    NS_SRC=$LHW_NS_B NS_DST=$LHW_NS_B ADDR_SRC=127.0.0.1 ADDR_DST=127.0.0.1
  else
    NS_SRC=$LHW_NS_A NS_DST=$LHW_NS_B ADDR_SRC=$LHW_ADDR_A ADDR_DST=$LHW_ADDR_B
  fi
  log "link up: ns $NS_SRC ($ADDR_SRC) -> $NS_DST ($ADDR_DST), rate=$rate delay=$delay loss=$loss mtu=$mtu"
}

link_stats() { [[ -n "$LINK_CTL" ]] && "$WANEM" ctl "$LINK_CTL" stats; }

# Stops the emulator; it kills everything still running in its namespaces.
link_down() {
  if [[ -n "$WANEM_PID" ]]; then
    kill -TERM "$WANEM_PID" 2>/dev/null
    wait "$WANEM_PID" 2>/dev/null
    WANEM_PID=""
  fi
}

in_src() { ip netns exec "$NS_SRC" "$@"; }
in_dst() { ip netns exec "$NS_DST" "$@"; }

# A free TCP port in the destination namespace (namespaces start empty, so
# collisions are only with our own servers).
free_port() { echo $((20000 + RANDOM % 20000)); }

# star_up N RATE DELAY MTU: longhaul-wanem's N-site star (tests/wanem/README.md,
# "N-site star"); site K's namespace and address in STAR_NS[K], STAR_ADDR[K]
# (1-based). The emulator is this run's one link: link_stats and link_down
# apply to it.
STAR_NS=()
STAR_ADDR=()
star_up() {
  local n=$1 rate=$2 delay=$3 mtu=$4
  wanem_start --sites="$n" --rate="$rate" --delay="$delay" --loss=0 --queue=bdp --mtu="$mtu"
  local i
  STAR_NS=("")
  STAR_ADDR=("")
  for ((i = 1; i <= LHW_SITES; i++)); do
    local ns=LHW_NS_$i addr=LHW_ADDR_$i
    STAR_NS+=("${!ns}")
    STAR_ADDR+=("${!addr}")
  done
  log "star up: $n sites (${STAR_NS[*]:1}), each access link rate=$rate delay=$delay mtu=$mtu"
}
