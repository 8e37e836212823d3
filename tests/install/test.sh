#!/usr/bin/env bash
# The install tree and the .deb, as an operator and a client developer get
# them (run by deploy/test.sh after the ctest suite; about half a minute):
#  1. `cmake --install BUILD --prefix P` into a temporary P: the files are
#     there, the unit runs P/bin/longhauld, the installed longhauld serves the
#     installed CLI, tests/install/consumer builds with find_package(longhaul)
#     and passes its checks against that daemon, and Debian's /usr/bin/python3
#     imports the module from P with PYTHONPATH.
#  2. `cpack -G DEB`: longhaul and longhaul-dev hold what they should (the
#     binaries stripped, their debug info in -dbgsym packages; the example
#     configuration, longhaul-pki, docs, man pages that render without a
#     warning, bash completion), declare their Depends, carry the maintainer
#     scripts; the unpacked dev package builds the consumer too; the packaged
#     longhauld starts from the packaged example configuration once
#     longhaul-pki made its certificates. The maintainer scripts run against stub
#     commands on PATH: postinst creates the `longhaul` user once and never
#     enables or starts the service.
# Nothing is installed on the machine: every file goes to a temporary
# directory, removed on exit with the daemon this starts.
#   tests/install/test.sh [BUILD_DIR]   (default: build/, already built)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/lh-install.XXXXXX")
daemon_pid=
dbgsym_files=()
cleanup() {
  if [ -n "$daemon_pid" ]; then
    kill "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

failures=0
fail() {
  echo "install test: FAILED: $*" >&2
  failures=$((failures + 1))
}
expect_file() {
  [ -e "$1" ] || fail "missing ${1#"$tmp"/}"
}

for bin in longhauld longhaul; do
  [ -x "$build/bin/$bin" ] || { echo "install test: build $bin first (deploy/build.sh)" >&2; exit 1; }
done
ls "$build"/python/longhaul/_longhaul*.so >/dev/null 2>&1 ||
  { echo "install test: build longhaul_python first (deploy/build.sh)" >&2; exit 1; }

# --- 1. cmake --install ------------------------------------------------------
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log"
for f in bin/longhauld bin/longhaul include/longhaul/client.h include/longhaul/exchange.h \
  include/longhaul/v1/control.pb.h lib/cmake/longhaul/longhaulConfig.cmake \
  lib/systemd/system/longhauld.service bin/longhaul-pki etc/longhaul/longhauld.yaml.example \
  share/doc/longhaul/README.md share/doc/longhaul/SECURITY.md share/doc/longhaul/CONFIG.md \
  share/doc/longhaul/examples/longhauld.yaml.example share/man/man1/longhaul.1.gz \
  share/man/man8/longhauld.8.gz share/bash-completion/completions/longhaul; do
  expect_file "$prefix/$f"
done
pydir=$prefix/lib/python3/dist-packages
ls "$pydir"/longhaul/_longhaul.cpython-*.so >/dev/null 2>&1 || fail "no Python extension in $pydir/longhaul"
for f in __init__.py torch.py; do expect_file "$pydir/longhaul/$f"; done
grep -qx "ExecStart=$prefix/bin/longhauld --config /etc/longhaul/longhauld.yaml" \
  "$prefix/lib/systemd/system/longhauld.service" || fail "the installed unit does not run $prefix/bin/longhauld"

# The installed daemon, on a throwaway PKI, state dir and port.
"$root/deploy/pki.sh" "$tmp/pki" site-a >/dev/null 2>&1
sock=$tmp/site-a/control.sock
mkdir -p "$tmp/site-a"
cat >"$tmp/site-a/longhauld.yaml" <<YAML
site: site-a
listen: 127.0.0.1:0
state_dir: $tmp/site-a/state
control_socket: $sock
tls: {ca: $tmp/pki/ca.pem, cert: $tmp/pki/site-a.pem, key: $tmp/pki/site-a.key}
metrics: {listen: ""}
YAML
"$prefix/bin/longhauld" --config "$tmp/site-a/longhauld.yaml" >"$tmp/site-a/longhauld.log" 2>&1 </dev/null &
daemon_pid=$!
for _ in $(seq 100); do
  [ -S "$sock" ] && break
  kill -0 "$daemon_pid" 2>/dev/null || break
  sleep 0.1
done
if [ -S "$sock" ]; then
  "$prefix/bin/longhaul" --daemon "unix:$sock" ls --all >"$tmp/ls.out" ||
    fail "the installed CLI cannot list the installed daemon's transfers"
else
  fail "the installed longhauld did not open its control socket: $(tail -3 "$tmp/site-a/longhauld.log")"
fi

# A client project of its own, against the installed package only.
consumer_build() {  # PREFIX_PATH BUILD_DIR
  cmake -S "$root/tests/install/consumer" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$1" >"$2.log" 2>&1 &&
    cmake --build "$2" >>"$2.log" 2>&1
}
if consumer_build "$prefix" "$tmp/consumer"; then
  "$tmp/consumer/consumer" "unix:$tmp/no-daemon.sock" "unix:$sock" ||
    fail "the consumer's checks against the install tree"
else
  fail "the consumer does not build against the install tree: $(tail -20 "$tmp/consumer.log")"
fi

(cd "$tmp" && PYTHONPATH=$pydir /usr/bin/python3 - "$prefix" "unix:$sock" "unix:$tmp/no-daemon.sock") <<'PY' ||
import sys
import longhaul
prefix, live, dead = sys.argv[1:]
assert longhaul.__file__.startswith(prefix + "/"), longhaul.__file__
assert longhaul._longhaul.__file__.startswith(prefix + "/"), longhaul._longhaul.__file__
assert repr(longhaul.Client) == "<class 'longhaul.Client'>", repr(longhaul.Client)
try:
    import torch  # noqa: F401 - python3-torch, where installed
except ImportError:
    torch = None
if torch is not None:
    import longhaul.torch
    assert longhaul.torch.__file__.startswith(prefix + "/"), longhaul.torch.__file__
    assert longhaul.torch.plan_buckets([torch.zeros(4), torch.zeros(4)], 16) == [[0], [1]]
try:
    longhaul.Client(dead, timeout=0.2)
    raise AssertionError("a Client with no daemon was constructed")
except longhaul.Error as e:
    assert "cannot reach longhauld" in str(e), e
client = longhaul.Client(live)
try:
    client.get("no-such-transfer")
    raise AssertionError("get of an unknown transfer returned")
except longhaul.Error as e:
    assert "no-such-transfer" in str(e), e
PY
  fail "the Python module from the install tree"

kill "$daemon_pid" && wait "$daemon_pid" 2>/dev/null || true
daemon_pid=

# --- 2. the .deb --------------------------------------------------------------
(cd "$build" && cpack -G DEB -B "$tmp/deb" >"$tmp/cpack.log" 2>&1) ||
  { echo "install test: cpack failed: $(tail -20 "$tmp/cpack.log")" >&2; exit 1; }
deb=$(ls "$tmp"/deb/longhaul_*.deb 2>/dev/null | head -1)
dev=$(ls "$tmp"/deb/longhaul-dev_*.deb 2>/dev/null | head -1)
[ -n "$deb" ] && [ -n "$dev" ] || { echo "install test: cpack made $(ls "$tmp/deb")" >&2; exit 1; }
version=$(dpkg-deb -f "$deb" Version)

dpkg-deb -c "$deb" | awk '{print $6}' >"$tmp/deb.list"
for f in ./usr/bin/longhauld ./usr/bin/longhaul ./usr/lib/systemd/system/longhauld.service \
  ./usr/bin/longhaul-pki ./etc/longhaul/longhauld.yaml.example \
  ./usr/share/doc/longhaul/README.md ./usr/share/doc/longhaul/SECURITY.md \
  ./usr/share/doc/longhaul/CONFIG.md ./usr/share/doc/longhaul/examples/longhauld.yaml.example \
  ./usr/share/man/man1/longhaul.1.gz ./usr/share/man/man8/longhauld.8.gz \
  ./usr/share/bash-completion/completions/longhaul; do
  grep -qx "$f" "$tmp/deb.list" || fail "longhaul.deb lacks $f"
done
grep -qE '^\./usr/lib/python3/dist-packages/longhaul/_longhaul\.cpython-.*\.so$' "$tmp/deb.list" ||
  fail "longhaul.deb lacks the Python extension"
for f in __init__.py torch.py; do
  grep -qx "./usr/lib/python3/dist-packages/longhaul/$f" "$tmp/deb.list" || fail "longhaul.deb lacks longhaul/$f"
done
outside=$(grep -vE '^\./((usr/((lib|share)/)?)|etc/)?$|^\./usr/(bin|lib/python3|lib/systemd)/|^\./etc/longhaul/|^\./usr/share/((doc|man|bash-completion)/|doc/longhaul/|bash-completion/completions/)' "$tmp/deb.list" || true)
[ -z "$outside" ] || fail "longhaul.deb installs outside /usr/bin, /usr/lib/python3, /usr/lib/systemd, /usr/share/{doc,man,bash-completion}, /etc/longhaul: $outside"
grep -qx '/etc/longhaul/longhauld.yaml.example' <(dpkg-deb -I "$deb" conffiles 2>/dev/null) ||
  fail "longhaul.deb does not mark /etc/longhaul/longhauld.yaml.example as a conffile"
[ "$(dpkg-deb -f "$deb" Package)" = longhaul ] || fail "the runtime package is not named longhaul"
depends=$(dpkg-deb -f "$deb" Depends)
for d in adduser libgrpc++ libprotobuf librocksdb libssl3 liburing libabsl; do
  [[ "$depends" == *"$d"* ]] || fail "longhaul.deb does not depend on $d: $depends"
done
dpkg-deb -I "$deb" >"$tmp/deb.info"
for s in postinst prerm postrm; do
  grep -qE "^ +[0-9]+ bytes, +[0-9]+ lines +\* +$s " "$tmp/deb.info" || fail "longhaul.deb has no executable $s"
done

mkdir -p "$tmp/root"
dpkg-deb -x "$deb" "$tmp/root"
dpkg-deb -x "$dev" "$tmp/root"
grep -qx 'ExecStart=/usr/bin/longhauld --config /etc/longhaul/longhauld.yaml' \
  "$tmp/root/usr/lib/systemd/system/longhauld.service" || fail "the packaged unit does not run /usr/bin/longhauld"
project_version=$(sed -nE 's/^project\(longhaul VERSION ([0-9.]+).*/\1/p' "$root/CMakeLists.txt")
for bin in longhauld longhaul; do
  "$tmp/root/usr/bin/$bin" --help >/dev/null || fail "the packaged $bin does not run"
  v=$("$tmp/root/usr/bin/$bin" --version) || fail "the packaged $bin --version exited $?"
  [[ "$v" == "$project_version"* ]] || fail "the packaged $bin --version printed '$v', not $project_version"
  status=0
  "$tmp/root/usr/bin/$bin" --no-such-flag >/dev/null 2>&1 || status=$?
  [ "$status" -eq 2 ] || fail "the packaged $bin exits $status, not 2, on a usage error"
  # Stripped: no symbol table, no DWARF; the debug info is in the -dbgsym package.
  sections=$(readelf -SW "$tmp/root/usr/bin/$bin")
  if grep -qE ' \.(symtab|debug_info) ' <<<"$sections"; then fail "the packaged $bin is not stripped"; fi
  build_id=$(readelf -nW "$tmp/root/usr/bin/$bin" | sed -nE 's/.*Build ID: ([0-9a-f]+).*/\1/p')
  [ -n "$build_id" ] || fail "the packaged $bin has no build id"
  dbgsym_files+=("./usr/lib/debug/.build-id/${build_id:0:2}/${build_id:2}.debug")
done
dbgsym=$(ls "$tmp"/deb/longhaul-dbgsym_*.*deb 2>/dev/null | head -1 || true)
if [ -z "$dbgsym" ]; then
  fail "cpack made no longhaul-dbgsym package: $(ls "$tmp/deb")"
else
  dpkg-deb -c "$dbgsym" | awk '{print $6}' >"$tmp/dbgsym.list"
  for f in "${dbgsym_files[@]}"; do
    grep -qx "$f" "$tmp/dbgsym.list" || fail "$(basename "$dbgsym") lacks $f"
  done
fi

# Man pages render without a warning; the example configuration lists every
# key of deploy/CONFIG.md (the last lower-case part of its name).
for page in "$tmp"/root/usr/share/man/man*/*.gz; do
  warnings=$(MANWIDTH=80 man --warnings -l "$page" 2>&1 >/dev/null)
  [ -z "$warnings" ] || fail "man -l ${page#"$tmp"/root} warns: $warnings"
done
example=$tmp/root/etc/longhaul/longhauld.yaml.example
for key in $(grep -oE '^\| `[a-z_]+(\[\])?(\.[a-z_A-Z]+(\[\])?)*`' "$root/deploy/CONFIG.md" |
  tr -d '|` ' | grep -v '^longhaul_' | sort -u); do
  leaf=$(tr '.' '\n' <<<"${key//\[\]/}" | grep -E '^[a-z_]+$' | tail -1)
  grep -qE "(^[# ]*(- )?|[{ ,])$leaf:" "$example" || fail "the example configuration lacks $key"
done
bash -n "$tmp/root/usr/share/bash-completion/completions/longhaul" ||
  fail "the bash completion does not parse"

# The packaged daemon from the packaged example, its paths moved under $tmp:
# it starts (control socket, a first log line) once longhaul-pki made the
# certificates, with a bad key its first error names the documentation.
if [ -f "$example" ]; then
  etc=$tmp/etc-longhaul
  mkdir -p "$etc"
  "$tmp/root/usr/bin/longhaul-pki" "$etc/tls" site-a >"$tmp/pki.log" 2>&1 ||
    fail "longhaul-pki failed: $(tail -3 "$tmp/pki.log")"
  sed -e "s|/etc/longhaul/|$etc/|g" -e "s|/var/lib/longhaul|$tmp/var|g" \
    -e 's|^listen: 0\.0\.0\.0:7700|listen: 127.0.0.1:0|' "$example" >"$etc/longhauld.yaml"
  printf 'metrics:\n  listen: ""\n' >>"$etc/longhauld.yaml"
  "$tmp/root/usr/bin/longhauld" --config "$etc/longhauld.yaml" >"$tmp/example.log" 2>&1 </dev/null &
  daemon_pid=$!
  for _ in $(seq 100); do
    [ -S "$tmp/var/control.sock" ] && break
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
  done
  [ -S "$tmp/var/control.sock" ] && [ -s "$tmp/example.log" ] ||
    fail "longhauld did not start from the example configuration: $(tail -3 "$tmp/example.log")"
  kill "$daemon_pid" && wait "$daemon_pid" 2>/dev/null || true
  daemon_pid=
  echo "no_such_key: 1" >>"$etc/longhauld.yaml"
  status=0
  "$tmp/root/usr/bin/longhauld" --config "$etc/longhauld.yaml" >"$tmp/bad.log" 2>&1 </dev/null || status=$?
  [ "$status" -eq 1 ] && grep -q 'man longhauld' "$tmp/bad.log" ||
    fail "longhauld on a bad key exits $status and does not name its documentation: $(cat "$tmp/bad.log")"
else
  fail "longhaul.deb has no example configuration to start longhauld from"
fi
[ "$(dpkg-deb -f "$dev" Package)" = longhaul-dev ] || fail "the dev package is not named longhaul-dev"
if consumer_build "$tmp/root/usr" "$tmp/consumer-deb"; then
  "$tmp/consumer-deb/consumer" "unix:$tmp/no-daemon.sock" || fail "the consumer's checks against longhaul-dev"
else
  fail "the consumer does not build against longhaul-dev: $(tail -20 "$tmp/consumer-deb.log")"
fi
(cd "$tmp" && PYTHONPATH=$tmp/root/usr/lib/python3/dist-packages /usr/bin/python3 -c \
  'import longhaul, sys; assert longhaul.__file__.startswith(sys.argv[1]), longhaul.__file__; longhaul.Client' \
  "$tmp/root/usr/") || fail "the packaged Python module does not import"

# The maintainer scripts, against stubs that record their calls.
dpkg-deb -e "$deb" "$tmp/control"
stubs=$tmp/stubs
mkdir -p "$stubs"
# Every command that could change users, services or files on this machine.
for tool in adduser addgroup useradd groupadd deluser delgroup userdel groupdel systemctl \
  deb-systemd-helper deb-systemd-invoke invoke-rc.d service chown chmod install mkdir rm; do
  printf '#!/bin/sh\necho "%s $*" >>%s/calls\n' "$tool" "$tmp" >"$stubs/$tool"
done
# getent: the user exists once $tmp/user-exists does.
printf '#!/bin/sh\n[ -e %s/user-exists ]\n' "$tmp" >"$stubs/getent"
chmod +x "$stubs"/*
run_script() {  # SCRIPT ARGS...
  : >"$tmp/calls"
  PATH=$stubs:/usr/bin:/bin sh "$tmp/control/$1" "${@:2}" || fail "$1 $* exited $?"
}
service_changes() {
  grep -E '(systemctl|deb-systemd-[a-z]+|invoke-rc\.d|service) .*(enable|start|restart|unmask)' "$tmp/calls"
}

run_script postinst configure
grep -qE '^adduser --system .*--group .* longhaul$' "$tmp/calls" ||
  fail "postinst does not create the longhaul system user: $(cat "$tmp/calls")"
service_changes && fail "postinst enables or starts the service"
touch "$tmp/user-exists"
run_script postinst configure "$version"
grep -qE '^(adduser|useradd)' "$tmp/calls" && fail "postinst adds the longhaul user again on upgrade"
service_changes && fail "postinst enables or starts the service on upgrade"
run_script prerm upgrade "$version"
grep -q 'stop' "$tmp/calls" && fail "prerm stops the service on upgrade"
run_script postrm purge
grep -qE '^(deluser|delgroup|userdel|groupdel|rm)' "$tmp/calls" && fail "postrm removes the user or the state on purge"

if [ "$failures" -ne 0 ]; then
  echo "install test: $failures check(s) failed" >&2
  exit 1
fi
echo "install test: install tree and .deb OK ($(basename "$deb"), $(basename "$dev"))"
