#!/usr/bin/env bash
# Two longhaul sites on this machine, for the demo, the tests and trying things.
#   deploy/local-sites.sh up DIR     start site-a and site-b (whichever is not running)
#   deploy/local-sites.sh down DIR   stop every site running under DIR, whatever
#                                    LONGHAUL_LOCAL_SITES says (SIGTERM, then
#                                    SIGKILL after 30 s)
# `up` prints, and only prints, the two lines
#   export LONGHAUL_SITE_A=unix:DIR/site-a/control.sock
#   export LONGHAUL_SITE_B=unix:DIR/site-b/control.sock
# so that `eval "$(deploy/local-sites.sh up DIR)"` works. Each site has its
# state under DIR/SITE/state, its log in DIR/SITE/longhauld.log, an export
# named `ckpt` at DIR/SITE/ckpt, and one named `local` at DIR itself, so that
# anything under DIR can be sent (sources must lie inside an export; the
# site's state and DIR/pki, the directory of its key and of the CA's key, are
# refused all the same). Certificates are made on first run in DIR/pki (`deploy/pki.sh revoke DIR/pki SITE`, then SIGHUP the
# daemons, revokes one).
# Environment: LONGHAUL_BIN (default build/bin), LONGHAUL_LOCAL_EXTRA (YAML
# appended to both configs), LONGHAUL_LOCAL_SITES (default "site-a site-b":
# more sites, e.g. "site-a site-b site-c", each peered with all the others;
# `up` then prints one export line per site, LONGHAUL_SITE_C and so on).
# Every site lets all the others write into and read from its export, unless
# LONGHAUL_LOCAL_WRITERS / LONGHAUL_LOCAL_READERS say otherwise for it:
# space-separated SITE=PEER,PEER entries, e.g. "site-b=site-a" (only site-a
# may send to site-b) or "site-b=" (nobody may).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${LONGHAUL_BIN:-$root/build/bin}
read -r -a sites <<<"${LONGHAUL_LOCAL_SITES:-site-a site-b}"

usage() {
  echo "usage: $0 up|down DIR" >&2
  exit 2
}
[ $# -eq 2 ] || usage
cmd=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)

free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 40000))
    if ! ss -Htln "sport = :$port" | grep -q .; then
      echo "$port"
      return
    fi
  done
}

# True while the site's daemon is alive (a zombie waiting to be reaped is not).
running() {
  local pidfile=$dir/$1/longhauld.pid pid state
  [ -f "$pidfile" ] || return 1
  pid=$(cat "$pidfile")
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# access_list SITE LIST DEFAULT: the entry for SITE in LIST ("SITE=A,B ..."),
# as a YAML flow sequence, or DEFAULT when LIST has none for SITE.
access_list() {
  local site=$1 list=$2 default=$3 entry
  for entry in $list; do
    if [ "${entry%%=*}" = "$site" ]; then
      echo "[${entry#*=}]" | sed 's/,/, /g'
      return
    fi
  done
  echo "$default"
}

write_config() {
  local site=$1 port=$2
  shift 2
  local others=() a
  for ((a = 1; a <= $#; a += 2)); do others+=("${!a}"); done
  local all_others
  all_others="[$(IFS=,; echo "${others[*]}" | sed 's/,/, /g')]"
  cat >"$dir/$site/longhauld.yaml" <<YAML
# Written by deploy/local-sites.sh; see deploy/CONFIG.md.
site: $site
listen: 127.0.0.1:$port
state_dir: $dir/$site/state
control_socket: $dir/$site/control.sock
tls:
  ca: $dir/pki/ca.pem
  cert: $dir/pki/$site.pem
  key: $dir/pki/$site.key
  crl: $dir/pki/crl.pem
exports:
  - name: ckpt
    path: $dir/$site/ckpt
    writers: $(access_list "$site" "${LONGHAUL_LOCAL_WRITERS:-}" "$all_others")
    readers: $(access_list "$site" "${LONGHAUL_LOCAL_READERS:-}" "$all_others")
  # Send-only: what the demo and the tests send lives under DIR, and a
  # transfer's sources must lie inside an export.
  - name: local
    path: $dir
peers:
$(while [ $# -gt 0 ]; do printf '  - site: %s\n    address: 127.0.0.1:%s\n' "$1" "$2"; shift 2; done)
link:
  bandwidth: 10Gbit
  rtt: 1ms
$(case "${LONGHAUL_LOCAL_EXTRA:-}" in *metrics:*) ;; *) printf 'metrics:\n  listen: 127.0.0.1:0  # several sites share this host\n' ;; esac)
${LONGHAUL_LOCAL_EXTRA:-}
YAML
}

start() {
  local site=$1
  running "$site" && return 0
  rm -f "$dir/$site/control.sock"
  setsid "$bin/longhauld" --config "$dir/$site/longhauld.yaml" >>"$dir/$site/longhauld.log" 2>&1 </dev/null &
  echo $! >"$dir/$site/longhauld.pid"
}

wait_ready() {
  local site=$1
  for _ in $(seq 1 100); do
    [ -S "$dir/$site/control.sock" ] && return 0
    if ! running "$site"; then break; fi
    sleep 0.1
  done
  echo "local-sites: $site did not start; its log says:" >&2
  tail -n 20 "$dir/$site/longhauld.log" >&2
  return 1
}

case $cmd in
  up)
    if [ ! -x "$bin/longhauld" ]; then
      echo "local-sites: $bin/longhauld is not built (run ./deploy/test.sh or cmake --build build)" >&2
      exit 1
    fi
    for s in "${sites[@]}"; do mkdir -p "$dir/$s/ckpt" "$dir/$s/state"; done
    "$root/deploy/pki.sh" "$dir/pki" "${sites[@]}"
    # A port found free can be taken before the daemon binds it: pick again.
    for attempt in 1 2 3; do
      missing_config=0
      # A config from before exports listed their writers would refuse every peer.
      for s in "${sites[@]}"; do
        grep -qs '^    writers:' "$dir/$s/longhauld.yaml" || missing_config=1
      done
      if [ "$missing_config" = 1 ]; then
        # One free port per site; every site peers with all the others.
        declare -A port=()
        for s in "${sites[@]}"; do
          p=$(free_port)
          while [[ " ${port[*]} " == *" $p "* ]]; do p=$(free_port); done
          port[$s]=$p
        done
        for s in "${sites[@]}"; do
          peer_args=()
          for o in "${sites[@]}"; do [ "$o" = "$s" ] || peer_args+=("$o" "${port[$o]}"); done
          write_config "$s" "${port[$s]}" "${peer_args[@]}"
        done
      fi
      for s in "${sites[@]}"; do start "$s"; done
      ready=yes
      for s in "${sites[@]}"; do wait_ready "$s" || ready=no; done
      [ $ready = yes ] && break
      if [ $attempt -lt 3 ] && grep -q "cannot listen for peers" "$dir"/site-*/longhauld.log; then
        echo "local-sites: port taken; retrying with new ports" >&2
        "$0" down "$dir"
        rm -f "$dir"/site-*/longhauld.yaml
        : >"$dir/site-a/longhauld.log"
        : >"$dir/site-b/longhauld.log"
        continue
      fi
      exit 1
    done
    for s in "${sites[@]}"; do
      var=$(echo "${s#site-}" | tr '[:lower:]-' '[:upper:]_')
      echo "export LONGHAUL_SITE_$var=unix:$dir/$s/control.sock"
    done
    ;;
  down)
    # Every site that `up` started here, also those a LONGHAUL_LOCAL_SITES
    # given to `up` but not to `down` named.
    for pidfile in "$dir"/*/longhauld.pid; do
      [ -f "$pidfile" ] || continue
      s=$(basename "$(dirname "$pidfile")")
      [[ " ${sites[*]} " == *" $s "* ]] || sites+=("$s")
    done
    for s in "${sites[@]}"; do
      running "$s" && kill -TERM "$(cat "$dir/$s/longhauld.pid")" 2>/dev/null || true
    done
    for s in "${sites[@]}"; do
      for _ in $(seq 1 300); do
        running "$s" || break
        sleep 0.1
      done
      if running "$s"; then kill -KILL "$(cat "$dir/$s/longhauld.pid")" 2>/dev/null || true; fi
      rm -f "$dir/$s/longhauld.pid"
    done
    ;;
  *)
    usage
    ;;
esac
