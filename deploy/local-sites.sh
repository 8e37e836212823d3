#!/usr/bin/env bash
# Two longhaul sites on this machine, for the demo, the tests and trying things.
#   deploy/local-sites.sh up DIR     start site-a and site-b (whichever is not running)
#   deploy/local-sites.sh down DIR   stop both (SIGTERM, then SIGKILL after 30 s)
# `up` prints, and only prints, the two lines
#   export LONGHAUL_SITE_A=unix:DIR/site-a/control.sock
#   export LONGHAUL_SITE_B=unix:DIR/site-b/control.sock
# so that `eval "$(deploy/local-sites.sh up DIR)"` works. Each site has its
# state under DIR/SITE/state, its log in DIR/SITE/longhauld.log and an export
# named `ckpt` at DIR/SITE/ckpt. Certificates are made on first run in DIR/pki.
# Environment: LONGHAUL_BIN (default build/bin), LONGHAUL_LOCAL_EXTRA (YAML
# appended to both configs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${LONGHAUL_BIN:-$root/build/bin}
sites=(site-a site-b)

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

running() {
  local pidfile=$dir/$1/longhauld.pid
  [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

write_config() {
  local site=$1 port=$2 peer=$3 peer_port=$4
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
exports:
  - name: ckpt
    path: $dir/$site/ckpt
peers:
  - site: $peer
    address: 127.0.0.1:$peer_port
link:
  bandwidth: 10Gbit
  rtt: 1ms
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
    for s in "${sites[@]}"; do
      if [ ! -x "$bin/longhauld" ]; then
        echo "local-sites: $bin/longhauld is not built (run ./deploy/test.sh or cmake --build build)" >&2
        exit 1
      fi
      mkdir -p "$dir/$s/ckpt" "$dir/$s/state"
    done
    "$root/deploy/pki.sh" "$dir/pki" "${sites[@]}"
    if [ ! -f "$dir/site-a/longhauld.yaml" ] || [ ! -f "$dir/site-b/longhauld.yaml" ]; then
      port_a=$(free_port)
      port_b=$(free_port)
      while [ "$port_b" = "$port_a" ]; do port_b=$(free_port); done
      write_config site-a "$port_a" site-b "$port_b"
      write_config site-b "$port_b" site-a "$port_a"
    fi
    for s in "${sites[@]}"; do start "$s"; done
    for s in "${sites[@]}"; do wait_ready "$s"; done
    echo "export LONGHAUL_SITE_A=unix:$dir/site-a/control.sock"
    echo "export LONGHAUL_SITE_B=unix:$dir/site-b/control.sock"
    ;;
  down)
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
