#!/usr/bin/env bash
# Tests of longhaul-wanem against real kernel stacks: ping, iperf3, and the
# namespace bookkeeping. Needs root, /dev/net/tun, iproute2, ping and iperf3.
#
#   wan_test.sh CASE    CASE: rtt rate loss cut cleanup_normal
#                             cleanup_parent_killed cleanup_emulator_killed
#                             bench_killed
#                             star_rtt star_shared_uplink star_cut
#                             star_cleanup_normal star_cleanup_parent_killed
#                             star_cleanup_emulator_killed
#
# LONGHAUL_WANEM points at the binary (ctest sets it). All traffic stays on
# 198.18.0.0/15 inside the namespaces the emulator makes.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WANEM="${LONGHAUL_WANEM:-$HERE/../../build/bin/longhaul-wanem}"
TMP="$(mktemp -d /tmp/lhw-test.XXXXXX)"
WANEM_PID=""

fail() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "PASS: $*"; }

cleanup() {
  if [[ -n "$WANEM_PID" ]] && kill -0 "$WANEM_PID" 2>/dev/null; then
    kill -TERM "$WANEM_PID" 2>/dev/null
    wait "$WANEM_PID" 2>/dev/null
  fi
  "$WANEM" --cleanup-stale >/dev/null 2>&1
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[[ $(id -u) -eq 0 ]] || fail "needs root (network namespaces and TUN)"
[[ -x "$WANEM" ]] || fail "no emulator at $WANEM"
for tool in ip ping iperf3 awk; do
  command -v "$tool" >/dev/null || fail "missing $tool"
done
"$WANEM" --cleanup-stale >/dev/null || fail "cleanup-stale failed"

# wait_for FILE SECONDS
wait_for() {
  local i
  for ((i = 0; i < $2 * 20; i++)); do
    [[ -s "$1" ]] && return 0
    sleep 0.05
  done
  return 1
}

# start_wanem ARGS...: runs the emulator in the background and loads its
# ready file (LHW_NS_A, LHW_NS_B, LHW_ADDR_A, LHW_ADDR_B, LHW_PID; with
# --sites=N: LHW_SITES, LHW_NS_1..N, LHW_ADDR_1..N).
start_wanem() {
  rm -f "$TMP/ready"
  unset "${!LHW_@}"
  "$WANEM" --control="$TMP/ctl.sock" --ready-file="$TMP/ready" \
    --stats-json="$TMP/stats.json" "$@" >"$TMP/wanem.out" 2>&1 &
  WANEM_PID=$!
  wait_for "$TMP/ready" 10 || { cat "$TMP/wanem.out" >&2; fail "emulator did not come up"; }
  # shellcheck disable=SC1091
  . "$TMP/ready"
}

stop_wanem() {
  kill -TERM "$WANEM_PID"
  wait "$WANEM_PID" || fail "emulator exited with $?"
  WANEM_PID=""
}

ctl() { "$WANEM" ctl "$TMP/ctl.sock" "$@"; }
in_a() { ip netns exec "$LHW_NS_A" "$@"; }
in_b() { ip netns exec "$LHW_NS_B" "$@"; }

# json_field JSON DIRECTION FIELD: a counter from the stats JSON.
json_field() {
  sed -e "s/.*\"$2\":{\([^}]*\)}.*/\1/" <<<"$1" | tr ',' '\n' |
    awk -F: -v f="\"$3\"" '$1 == f { print $2 }'
}

# Within TOL of WANT (all in the same unit)?
within() { awk -v got="$1" -v want="$2" -v tol="$3" \
  'BEGIN { d = got - want; if (d < 0) d = -d; exit !(d <= tol) }'; }

# No namespace, TUN or process of emulator PID is left.
assert_gone() {
  local pid=$1 i
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  kill -0 "$pid" 2>/dev/null && fail "emulator $pid still running"
  ip netns list | grep -q "^lhw-$pid-" && fail "namespace of $pid left: $(ip netns list | grep "lhw-$pid-")"
  [[ -e /run/netns/lhw-$pid-a || -e /run/netns/lhw-$pid-b ]] && fail "netns mount of $pid left"
  for p in "${@:2}"; do
    kill -0 "$p" 2>/dev/null && fail "process $p started in the namespace is still running"
  done
  # TUN devices exist only inside the namespaces; none may appear here.
  ip -o link show type tun 2>/dev/null | grep -q lhw0 && fail "TUN device left in the root namespace"
  return 0
}

case_rtt() {
  local delay
  for delay in 5 20; do
    start_wanem --rate=1Gbit --delay=${delay}ms
    local out min median
    out=$(in_a ping -c 30 -i 0.02 -s 56 "$LHW_ADDR_B") || fail "ping failed: $out"
    # The link never shortens the delay (minimum), and a typical packet takes
    # just the delay (median: one reply the host scheduled late is not the
    # link's).
    read -r min median < <(sed -n 's/.* time=\([0-9.]*\) ms/\1/p' <<<"$out" | sort -n |
      awk '{ t[NR] = $1 } END { print t[1], t[int((NR + 1) / 2)] }')
    echo "delay ${delay}ms one way: measured RTT min ${min} ms, median ${median} ms"
    awk -v m="$min" -v d="$delay" 'BEGIN { exit !(m >= 2 * d) }' ||
      fail "RTT min $min ms is shorter than 2x${delay} ms"
    within "$median" $((2 * delay)) 1 || fail "RTT median $median ms not within 2x${delay} ms +-1 ms"
    stop_wanem
  done
  pass "RTT = 2 x delay +- 1 ms"
}

# cpu_ticks: total and stolen jiffies of all CPUs so far (/proc/stat).
cpu_ticks() {
  awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t, $9; exit }' /proc/stat
}

case_rate() {
  local mtu mbit
  for spec in "9000 200" "1500 100"; do
    read -r mtu mbit <<<"$spec"
    start_wanem --rate=${mbit}Mbit --delay=5ms --queue=bdp --mtu="$mtu"
    # The link's rate counts whole IP packets; TCP/IP headers (52 bytes with
    # timestamps) are not goodput.
    local want tolerance attempt got server t0 s0 t1 s1 stolen missed_unstarved=0
    want=$(awk -v r="$mbit" -v m="$mtu" 'BEGIN { print r * (m - 52) / m }')
    tolerance=$(awk -v r="$mbit" 'BEGIN { print r * 0.05 }')
    # The relay stamps packets when it reads them, so time the host takes
    # from this VM (steal) is time the link stands idle. A run in which the
    # hypervisor stole more than 5% of the CPU says nothing about the link and
    # is measured again; each run prints the steal and the emulator's counts.
    for attempt in 1 2 3; do
      in_b iperf3 -s -1 -B "$LHW_ADDR_B" >/dev/null 2>&1 &
      server=$!
      sleep 0.3
      read -r t0 s0 < <(cpu_ticks)
      got=$(in_a iperf3 -c "$LHW_ADDR_B" -t 5 -f m | awk '/receiver/ { for (i = 1; i <= NF; i++) if ($i == "Mbits/sec") print $(i - 1) }')
      read -r t1 s1 < <(cpu_ticks)
      wait "$server"
      stolen=$(awk -v t="$((t1 - t0))" -v s="$((s1 - s0))" 'BEGIN { printf "%.1f", (t > 0 ? 100 * s / t : 0) }')
      echo "MTU $mtu, rate $mbit Mbit/s, run $attempt: iperf3 goodput $got Mbit/s (payload share of the rate: $want), CPU stolen by the host: $stolen%"
      echo "  emulator a->b: $(sed -e 's/.*"a2b":{\([^}]*\)}.*/\1/' <<<"$(ctl stats)" | cut -d, -f1-7)"
      [[ -n "$got" ]] || fail "iperf3 gave no result"
      within "$got" "$want" "$tolerance" && break
      awk -v s="$stolen" 'BEGIN { exit !(s <= 5) }' && missed_unstarved=1
    done
    if ! within "$got" "$want" "$tolerance"; then
      [[ $missed_unstarved -eq 1 ]] &&
        fail "goodput not within 5% of $mbit Mbit/s (expected $want) in a run the host did not starve"
      echo "SKIP: the host stole more than 5% of the CPU in every run; the link's rate could not be measured"
      exit 77
    fi
    stop_wanem
  done
  pass "iperf3 within 5% of the set rate"
}

case_loss() {
  start_wanem --delay=2ms --a2b="loss=2%" --seed=$RANDOM
  # iperf3 opens a UDP test with one datagram that it never resends, so the
  # set loss drops it about one run in fifty and iperf3 gives up ("unable to
  # read from stream socket"). Such a run says nothing about the link: run
  # iperf3 again. The drop stays in the emulator's counts, which the checks
  # below allow for.
  local line="" lost total attempt server
  for attempt in 1 2 3; do
    in_b iperf3 -s -1 -B "$LHW_ADDR_B" >/dev/null 2>&1 &
    server=$!
    sleep 0.3
    line=$(in_a iperf3 -c "$LHW_ADDR_B" -u -b 40M -l 1200 -t 4 | grep receiver)
    if [[ -n "$line" ]]; then
      wait "$server"
      break
    fi
    echo "iperf3 run $attempt gave no result; again"
    kill "$server" 2>/dev/null
    wait "$server" 2>/dev/null
  done
  [[ -n "$line" ]] || fail "iperf3 gave no result in 3 runs"
  read -r lost total < <(sed -E 's#.* ([0-9]+)/([0-9]+) .*#\1 \2#' <<<"$line")
  local stats
  stats=$(ctl stats)
  local counted
  counted=$(json_field "$stats" a2b dropped_loss)
  echo "set 2% loss: iperf3 lost $lost of $total datagrams; emulator dropped_loss $counted"
  [[ "$total" -gt 10000 ]] || fail "too few datagrams ($total) for a statistical check"
  local forwarded
  forwarded=$(json_field "$stats" a2b forwarded_packets)
  # The loss process itself: drops over the packets it judged, within 5 sd
  # of the set 2% (binomial). End to end, iperf3 can only lose more than the
  # emulator dropped (a busy host also drops at the receiving socket).
  awk -v l="$counted" -v n="$((counted + forwarded))" 'BEGIN { p = 0.02; sd = sqrt(n * p * (1 - p));
      d = l - n * p; if (d < 0) d = -d; exit !(n > 10000 && d <= 5 * sd) }' ||
    fail "emulator loss $counted/$((counted + forwarded)) outside 5 sd of 2%"
  # (The emulator's count also covers a few iperf3 control packets: slack 20.)
  [[ $((lost + 20)) -ge "$counted" ]] ||
    fail "iperf3 saw $lost lost, fewer than the $counted the emulator dropped"
  stop_wanem
  pass "loss within statistical bounds of the set rate"
}

case_cut() {
  start_wanem --rate=1Gbit --delay=5ms
  in_a ping -q -c 5 -i 0.1 -W 1 "$LHW_ADDR_B" >/dev/null || fail "no traffic before the cut"
  ctl cut >/dev/null || fail "ctl cut failed"
  if in_a ping -q -c 5 -i 0.1 -W 1 "$LHW_ADDR_B" >/dev/null; then fail "traffic passed a cut link"; fi
  local cut_drops
  cut_drops=$(json_field "$(ctl stats)" a2b dropped_cut)
  [[ "$cut_drops" -ge 5 ]] || fail "cut drops not counted ($cut_drops)"
  ctl restore >/dev/null || fail "ctl restore failed"
  in_a ping -q -c 5 -i 0.1 -W 1 "$LHW_ADDR_B" >/dev/null || fail "no traffic after restore"
  # The signals do the same.
  kill -USR1 "$WANEM_PID"
  sleep 0.1
  if in_a ping -q -c 3 -i 0.1 -W 1 "$LHW_ADDR_B" >/dev/null; then fail "traffic passed a SIGUSR1 cut"; fi
  kill -USR2 "$WANEM_PID"
  sleep 0.1
  in_a ping -q -c 3 -i 0.1 -W 1 "$LHW_ADDR_B" >/dev/null || fail "no traffic after SIGUSR2"
  # A one-way cut stops the round trip too, and a TCP flow survives a short cut.
  in_b iperf3 -s -1 -B "$LHW_ADDR_B" >/dev/null 2>&1 &
  local server=$!
  sleep 0.3
  in_a iperf3 -c "$LHW_ADDR_B" -t 6 -b 50M -f m >"$TMP/iperf.txt" 2>&1 &
  local client=$!
  sleep 1
  # 2.2 s, so at least one whole 1 s iperf3 interval falls inside the cut.
  ctl cut a2b >/dev/null
  sleep 2.2
  ctl restore a2b >/dev/null
  wait "$client" || { cat "$TMP/iperf.txt" >&2; fail "TCP flow did not survive a 2 s cut"; }
  wait "$server"
  grep -q receiver "$TMP/iperf.txt" || fail "TCP flow did not finish"
  awk '/sec/ && !/sender|receiver/ { for (i = 1; i <= NF; i++) if ($i == "Mbits/sec" && $(i-1) + 0 < 5) z++ } END { exit !(z >= 1) }' "$TMP/iperf.txt" ||
    { cat "$TMP/iperf.txt" >&2; fail "no interval without traffic during the cut"; }
  stop_wanem
  pass "a cut stops traffic and a restore brings it back"
}

case_cleanup_normal() {
  start_wanem --delay=1ms
  local pid=$LHW_PID
  ip netns exec "$LHW_NS_B" sleep 300 &
  local sleeper=$!
  sleep 0.2
  stop_wanem
  assert_gone "$pid" "$sleeper"
  pass "nothing left after SIGTERM"
}

case_cleanup_parent_killed() {
  # A parent shell (standing in for a test or the harness) starts the link
  # and a process inside it, then dies by SIGKILL.
  bash -c '"$1" --ready-file="$2/ready" --delay=1ms >/dev/null 2>&1 &
           wait' _ "$WANEM" "$TMP" &
  local parent=$!
  wait_for "$TMP/ready" 10 || fail "emulator did not come up"
  . "$TMP/ready"
  ip netns exec "$LHW_NS_A" sleep 300 &
  local sleeper=$!
  sleep 0.2
  kill -KILL "$parent"
  wait "$parent" 2>/dev/null
  assert_gone "$LHW_PID" "$sleeper"
  pass "nothing left after the parent was SIGKILLed"
}

case_cleanup_emulator_killed() {
  start_wanem --delay=1ms
  ip netns exec "$LHW_NS_A" sleep 300 &
  local sleeper=$!
  sleep 0.2
  kill -KILL "$WANEM_PID"
  wait "$WANEM_PID" 2>/dev/null
  WANEM_PID=""
  ip netns list | grep -q "^$LHW_NS_A" || fail "expected a stale namespace to clean"
  "$WANEM" --cleanup-stale || fail "--cleanup-stale failed"
  assert_gone "$LHW_PID" "$sleeper"
  pass "--cleanup-stale removes what a SIGKILLed emulator left"
}

case_bench_killed() {
  # The benchmark harness killed half-way leaves nothing behind.
  local runsh="$HERE/../bench/run.sh"
  LONGHAUL_BENCH_TMP="$TMP" bash "$runsh" wan-lossy --smoke >"$TMP/bench.out" 2>&1 &
  local bench=$!
  local i ns="" pids=""
  for ((i = 0; i < 600; i++)); do
    ns=$(ip netns list | awk '/^lhw-/ { print $1; exit }')
    if [[ -n "$ns" ]]; then
      pids=$(ip netns pids "${ns%-?}-b" 2>/dev/null | tr '\n' ' ')
      [[ -n "$pids" ]] && break
    fi
    sleep 0.1
  done
  [[ -n "$pids" ]] || { cat "$TMP/bench.out" >&2; fail "bench never started servers in a namespace"; }
  sleep 1
  local owner=${ns#lhw-}
  owner=${owner%%-*}
  kill -KILL "$bench"
  wait "$bench" 2>/dev/null
  # shellcheck disable=SC2086
  assert_gone "$owner" $pids
  pass "nothing left after the bench harness was SIGKILLed (servers were: $pids)"
}

# --- The N-site star (--sites=N) ---

# Site K's namespace and address from the star's ready file.
ns_of() { local v="LHW_NS_$1"; echo "${!v}"; }
addr_of() { local v="LHW_ADDR_$1"; echo "${!v}"; }
# in_site K CMD...: runs CMD inside site K's namespace.
in_site() { local k=$1; shift; ip netns exec "$(ns_of "$k")" "$@"; }
# pings FROM TO COUNT: succeeds if any reply comes back.
pings() { in_site "$1" ping -q -c "$3" -i 0.1 -W 1 "$(addr_of "$2")" >/dev/null; }

# star_field JSON SITE DIR FIELD: a counter of site SITE's uplink (DIR=up) or
# downlink (DIR=down) from the star's stats JSON.
star_field() {
  sed -e "s/.*\"site$2\":{\"up\":{\([^}]*\)},\"down\":{\([^}]*\)}.*/\1|\2/" <<<"$1" |
    awk -F'|' -v d="$3" '{ print (d == "up" ? $1 : $2) }' | tr ',' '\n' |
    awk -F: -v f="\"$4\"" '$1 == f { print $2 }'
}

case_star_rtt() {
  local delay=5 i j out min median
  start_wanem --sites=4 --rate=1Gbit --delay=${delay}ms
  [[ "${LHW_SITES:-}" == 4 ]] || fail "ready file has LHW_SITES=${LHW_SITES:-unset}, not 4"
  # Site to site crosses two access links each way: RTT = 4 x delay.
  for ((i = 1; i <= 4; i++)); do
    for ((j = 1; j <= 4; j++)); do
      ((i == j)) && continue
      out=$(in_site $i ping -c 10 -i 0.02 -s 56 "$(addr_of $j)") || fail "ping $i -> $j failed: $out"
      read -r min median < <(sed -n 's/.* time=\([0-9.]*\) ms/\1/p' <<<"$out" | sort -n |
        awk '{ t[NR] = $1 } END { print t[1], t[int((NR + 1) / 2)] }')
      echo "site $i -> site $j: RTT min $min ms, median $median ms"
      awk -v m="$min" -v d="$delay" 'BEGIN { exit !(m >= 4 * d) }' ||
        fail "$i -> $j: RTT min $min ms is shorter than 4x${delay} ms"
      within "$median" $((4 * delay)) 1 ||
        fail "$i -> $j: RTT median $median ms not within 4x${delay} ms +-1 ms"
    done
  done
  stop_wanem
  pass "every pair of 4 sites: RTT = 4 x delay +- 1 ms"
}

case_star_shared_uplink() {
  # Two flows out of site 1, to sites 2 and 3, share site 1's uplink: their
  # sum is the uplink's rate, not twice it (each downlink could carry it all).
  local mbit=200 mtu=9000
  start_wanem --sites=3 --rate=${mbit}Mbit --delay=5ms --mtu=$mtu
  local want s2 s3 got2 got3 sum
  want=$(awk -v r="$mbit" -v m="$mtu" 'BEGIN { print r * (m - 52) / m }')
  in_site 2 iperf3 -s -1 -B "$(addr_of 2)" >/dev/null 2>&1 &
  s2=$!
  in_site 3 iperf3 -s -1 -B "$(addr_of 3)" >/dev/null 2>&1 &
  s3=$!
  sleep 0.3
  in_site 1 iperf3 -c "$(addr_of 2)" -t 6 -O 1 -f m >"$TMP/to2.txt" 2>&1 &
  local c2=$!
  in_site 1 iperf3 -c "$(addr_of 3)" -t 6 -O 1 -f m >"$TMP/to3.txt" 2>&1 &
  local c3=$!
  wait "$c2" || { cat "$TMP/to2.txt" >&2; fail "iperf3 1 -> 2 failed"; }
  wait "$c3" || { cat "$TMP/to3.txt" >&2; fail "iperf3 1 -> 3 failed"; }
  wait "$s2" "$s3"
  goodput() { awk '/receiver/ { for (i = 1; i <= NF; i++) if ($i == "Mbits/sec") print $(i - 1) }' "$1"; }
  got2=$(goodput "$TMP/to2.txt")
  got3=$(goodput "$TMP/to3.txt")
  [[ -n "$got2" && -n "$got3" ]] || fail "iperf3 gave no result"
  sum=$(awk -v a="$got2" -v b="$got3" 'BEGIN { print a + b }')
  echo "uplink $mbit Mbit/s: 1 -> 2 $got2 Mbit/s + 1 -> 3 $got3 Mbit/s = $sum (payload share of the rate: $want)"
  echo "  site 1 uplink: $(sed -e 's/.*"site1":{"up":{\([^}]*\)}.*/\1/' <<<"$(ctl stats)" | cut -d, -f1-5)"
  awk -v s="$sum" -v r="$mbit" 'BEGIN { exit !(s <= 1.05 * r) }' ||
    fail "two flows out of one site got $sum Mbit/s, more than its $mbit Mbit/s uplink"
  awk -v s="$sum" -v w="$want" 'BEGIN { exit !(s >= 0.8 * w) }' ||
    fail "two flows out of one site got $sum Mbit/s, far below its uplink ($want)"
  awk -v a="$got2" -v b="$got3" -v w="$want" 'BEGIN { exit !(a >= 0.1 * w && b >= 0.1 * w) }' ||
    fail "one of the flows was starved ($got2, $got3)"
  stop_wanem
  pass "destinations share the sender's uplink"
}

case_star_cut() {
  start_wanem --sites=3 --rate=1Gbit --delay=2ms
  pings 1 2 3 || fail "no traffic 1 -> 2 before the cut"
  ctl cut 1 >/dev/null || fail "ctl cut 1 failed"
  # Site 1 is lost: nobody reaches it and it reaches nobody; the others still
  # reach each other.
  if pings 1 2 3; then fail "traffic from a cut site"; fi
  if pings 3 1 3; then fail "traffic to a cut site"; fi
  pings 2 3 3 || fail "cutting site 1 stopped 2 -> 3"
  local stats
  stats=$(ctl stats)
  [[ "$(star_field "$stats" 1 up dropped_cut)" -ge 3 ]] ||
    fail "site 1 uplink cut drops not counted: $stats"
  [[ "$(star_field "$stats" 1 down dropped_cut)" -ge 3 ]] ||
    fail "site 1 downlink cut drops not counted: $stats"
  [[ "$(star_field "$stats" 2 up dropped_cut)" -eq 0 ]] || fail "site 2 counted cut drops"
  ctl restore 1 >/dev/null || fail "ctl restore 1 failed"
  pings 1 2 3 || fail "no traffic 1 -> 2 after restore"
  pings 3 1 3 || fail "no traffic 3 -> 1 after restore"
  # Only the uplink: site 1's packets vanish, so no round trip completes,
  # and the site's downlink still counts no cut drops.
  ctl cut 1 up >/dev/null || fail "ctl cut 1 up failed"
  local down_before
  down_before=$(star_field "$(ctl stats)" 1 down dropped_cut)
  if pings 2 1 3; then fail "a reply crossed site 1's cut uplink"; fi
  [[ "$(star_field "$(ctl stats)" 1 down dropped_cut)" -eq "$down_before" ]] ||
    fail "'cut 1 up' also cut the downlink"
  ctl restore all >/dev/null || fail "ctl restore all failed"
  pings 2 1 3 || fail "no traffic after restore all"
  ctl cut 4 >/dev/null 2>&1 && fail "ctl accepted a site that does not exist"
  # A loss burst of 1 on site 1 loses its packets as loss, not as a cut;
  # 'loss 0' ends it.
  ctl loss 1 1 >/dev/null || fail "ctl loss 1 1 failed"
  if pings 1 2 3; then fail "traffic through a total loss burst"; fi
  [[ "$(star_field "$(ctl stats)" 1 up dropped_loss)" -ge 3 ]] ||
    fail "site 1 burst losses not counted: $(ctl stats)"
  ctl loss 0 1 >/dev/null || fail "ctl loss 0 1 failed"
  pings 1 2 3 || fail "no traffic 1 -> 2 after the loss burst ended"
  ctl loss 2 1 >/dev/null 2>&1 && fail "ctl accepted a loss probability above 1"
  stop_wanem
  pass "cutting one site's access link loses that site only; restore brings it back; so do loss bursts"
}

case_star_cleanup_normal() {
  start_wanem --sites=4 --delay=1ms
  local pid=$LHW_PID sleepers=() k
  for k in 1 4; do
    in_site $k sleep 300 &
    sleepers+=($!)
  done
  sleep 0.2
  stop_wanem
  assert_gone "$pid" "${sleepers[@]}"
  pass "nothing of a 4-site star left after SIGTERM"
}

case_star_cleanup_parent_killed() {
  bash -c '"$1" --sites=3 --ready-file="$2/ready" --delay=1ms >/dev/null 2>&1 &
           wait' _ "$WANEM" "$TMP" &
  local parent=$!
  wait_for "$TMP/ready" 10 || fail "emulator did not come up"
  . "$TMP/ready"
  in_site 3 sleep 300 &
  local sleeper=$!
  sleep 0.2
  kill -KILL "$parent"
  wait "$parent" 2>/dev/null
  assert_gone "$LHW_PID" "$sleeper"
  pass "nothing of a star left after the parent was SIGKILLed"
}

case_star_cleanup_emulator_killed() {
  start_wanem --sites=3 --delay=1ms
  in_site 2 sleep 300 &
  local sleeper=$!
  sleep 0.2
  kill -KILL "$WANEM_PID"
  wait "$WANEM_PID" 2>/dev/null
  WANEM_PID=""
  [[ $(ip netns list | grep -c "^lhw-$LHW_PID-") -eq 3 ]] || fail "expected 3 stale namespaces to clean"
  "$WANEM" --cleanup-stale || fail "--cleanup-stale failed"
  assert_gone "$LHW_PID" "$sleeper"
  pass "--cleanup-stale removes what a SIGKILLed star left"
}

case_name="${1:-}"
declare -F "case_$case_name" >/dev/null || fail "unknown case '$case_name'"
"case_$case_name"
