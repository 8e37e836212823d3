# The anchors: iperf3, rsync over ssh, scp and rclone over sftp, each run
# through the same link as longhaul. Sourced by run.sh.

SSHD_PID=""
SSH_CIPHER=aes128-gcm@openssh.com

# The sshd binary the anchors run: $LONGHAUL_BENCH_SSHD, else the machine's
# /usr/sbin/sshd, else one unpacked from Debian's openssh-server package into
# build/bench-deps (downloaded once; `dpkg-deb -x` only, so the package is not
# installed: no service, no system user, no maintainer script).
bench_sshd() {
  if [[ -n "${LONGHAUL_BENCH_SSHD:-}" ]]; then
    [[ -x "$LONGHAUL_BENCH_SSHD" ]] || die "LONGHAUL_BENCH_SSHD=$LONGHAUL_BENCH_SSHD is not executable"
    echo "$LONGHAUL_BENCH_SSHD"
    return
  fi
  if [[ -x /usr/sbin/sshd ]]; then
    echo /usr/sbin/sshd
    return
  fi
  local dir="$REPO/build/bench-deps/openssh-server" tmp missing
  if [[ ! -x "$dir/usr/sbin/sshd" ]]; then
    log "no /usr/sbin/sshd: unpacking openssh-server into $dir (not installed)"
    tmp=$(mktemp -d)
    if ! (cd "$tmp" && apt-get download openssh-server) >"$tmp/log" 2>&1; then
      die "cannot download openssh-server (apt-get update first?): $(tail -c 300 "$tmp/log")"
    fi
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    dpkg-deb -x "$tmp"/openssh-server_*.deb "$dir.tmp" || die "cannot unpack openssh-server"
    rm -rf "$dir" "$tmp" && mv "$dir.tmp" "$dir"
  fi
  missing=$(ldd "$dir/usr/sbin/sshd" | awk '/not found/ { print $1 }' | tr '\n' ' ')
  [[ -z "$missing" ]] || die "$dir/usr/sbin/sshd needs $missing(deploy/install-deps.sh installs them)"
  echo "$dir/usr/sbin/sshd"
}

# An sshd of our own in the destination namespace: generated host and user
# keys, a high port, nothing of the system's sshd touched. Run as root, sshd
# needs its privilege separation user `sshd`; on a machine without one it
# gets a passwd that adds it, bound over /etc/passwd in a mount namespace of
# its own (the machine's /etc/passwd is not changed).
sshd_up() {
  local dir="$WORK/ssh" sshd
  sshd=$(bench_sshd) || exit 1
  mkdir -p "$dir" && chmod 700 "$dir"
  ssh-keygen -q -t ed25519 -N '' -f "$dir/host_key" || die "ssh-keygen failed"
  ssh-keygen -q -t ed25519 -N '' -f "$dir/user_key" || die "ssh-keygen failed"
  cp "$dir/user_key.pub" "$dir/authorized_keys"
  SSH_PORT=$(free_port)
  cat >"$dir/sshd_config" <<CFG
Port $SSH_PORT
ListenAddress $ADDR_DST
HostKey $dir/host_key
AuthorizedKeysFile $dir/authorized_keys
PidFile $dir/sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
LogLevel ERROR
CFG
  cat >"$dir/ssh_config" <<CFG
Host bench-dst
  HostName $ADDR_DST
  Port $SSH_PORT
  User root
  IdentityFile $dir/user_key
  IdentitiesOnly yes
  StrictHostKeyChecking yes
  UserKnownHostsFile $dir/known_hosts
  BatchMode yes
  LogLevel ERROR
CFG
  echo "[$ADDR_DST]:$SSH_PORT $(cat "$dir/host_key.pub")" >"$dir/known_hosts"
  mkdir -p /run/sshd  # sshd's privilege separation directory
  local wrap=()
  if ! getent passwd sshd >/dev/null; then
    cp /etc/passwd "$dir/passwd"
    echo "sshd:x:$(free_uid):65534:longhaul bench sshd:/run/sshd:/usr/sbin/nologin" >>"$dir/passwd"
    # sh execs sshd, so $! below is still sshd.
    wrap=(unshare --mount --propagation private
          sh -c 'mount --bind "$0" /etc/passwd && exec "$@"' "$dir/passwd")
  fi
  # Not through the in_dst function: $! must be sshd itself (ip netns exec
  # execs it), whose reaped children carry the server side's CPU time.
  ip netns exec "$NS_DST" "${wrap[@]}" "$sshd" -D -e -f "$dir/sshd_config" 2>"$WORK/sshd.log" &
  SSHD_PID=$!
  BG_PIDS+=("$SSHD_PID")
  local i
  for ((i = 0; i < 50; i++)); do
    in_src ssh -F "$dir/ssh_config" bench-dst true 2>/dev/null && break
    sleep 0.1
  done
  in_src ssh -F "$dir/ssh_config" bench-dst true || die "cannot ssh to our sshd ($(cat "$WORK/sshd.log"))"
  SSH_CMD="ssh -F $dir/ssh_config -c $SSH_CIPHER"
  log "sshd up on $ADDR_DST:$SSH_PORT in $NS_DST"
}

# A uid no account uses, for the privilege separation user.
free_uid() {
  local uid
  for ((uid = 64999; uid > 60000; uid--)); do
    getent passwd "$uid" >/dev/null || { echo "$uid"; return; }
  done
  die "no free uid for sshd's privilege separation user"
}

# ssh_row TOOL DEST_DIR CMD...: a file copy through our sshd, timed, with the
# server side's CPU, verified against the source.
ssh_row() {
  local tool=$1 dest=$2
  shift 2
  rm -rf "$dest"
  link_mark
  wait_no_children "$SSHD_PID"
  local s0
  s0=$(proc_cpu "$SSHD_PID")
  local name=${tool//[^A-Za-z0-9._-]/_}
  log "$tool: running"
  measure "$name" "$@"
  log "$tool: done in ${M_SECONDS}s (exit $M_RC), checking"
  wait_no_children "$SSHD_PID"
  local cpu
  cpu=$(add "$M_CPU" "$(sub "$(proc_cpu "$SSHD_PID")" "$s0")")
  if [[ "$M_RC" != 0 ]]; then
    result_error "$tool" "exit $M_RC: $(tail -c 300 "$WORK/$name.err" | tr '\n' ' ')"
    rm -rf "$dest"
    return
  fi
  local verified
  verified=$(verify_tree "$dest")
  result "$tool" "$DATA_BYTES" "$M_SECONDS" "$cpu" "$verified" "files=$DATA_FILES"
  rm -rf "$dest"
}

anchor_rsync() {
  local dest="$WORK/dst/rsync"
  mkdir -p "$WORK/dst"
  ssh_row "rsync/ssh" "$dest" in_src rsync -a -e "$SSH_CMD" "$SRC/" "bench-dst:$dest/"
}

anchor_scp() {
  local dest="$WORK/dst/scp"
  mkdir -p "$WORK/dst"
  ssh_row "scp" "$dest" in_src scp -q -r -F "$WORK/ssh/ssh_config" -c "$SSH_CIPHER" "$SRC" "bench-dst:$dest"
}

anchor_rclone() {
  local dest="$WORK/dst/rclone"
  mkdir -p "$WORK/dst"
  # The remote is configured entirely through the environment. No remote
  # hash check: it runs md5sum over ssh once per file (minutes on small-files
  # at 40 ms RTT), and the harness verifies every file itself.
  ssh_row "rclone/sftp" "$dest" in_src env \
    RCLONE_CONFIG=/dev/null \
    RCLONE_CONFIG_BENCH_TYPE=sftp \
    RCLONE_CONFIG_BENCH_HOST="$ADDR_DST" \
    RCLONE_CONFIG_BENCH_PORT="$SSH_PORT" \
    RCLONE_CONFIG_BENCH_USER=root \
    RCLONE_CONFIG_BENCH_KEY_FILE="$WORK/ssh/user_key" \
    RCLONE_CONFIG_BENCH_KNOWN_HOSTS_FILE="$WORK/ssh/known_hosts" \
    RCLONE_CONFIG_BENCH_SHELL_TYPE=unix \
    RCLONE_CONFIG_BENCH_DISABLE_HASHCHECK=true \
    rclone copy "$SRC" "bench:$dest" --transfers 8 --multi-thread-streams 8
}

# anchor_iperf3 TOOL SECONDS IPERF3_ARGS...: memory to memory through the link.
anchor_iperf3() {
  local tool=$1 secs=$2
  shift 2
  local port
  port=$(free_port)
  link_mark
  ( { in_dst iperf3 -s -1 --idle-timeout 30 -B "$ADDR_DST" -p "$port" >"$WORK/iperf3-server.log" 2>&1; times; } \
      >"$WORK/iperf3-server.times" ) &
  local server=$!
  BG_PIDS+=("$server")
  local i
  for ((i = 0; i < 50; i++)); do
    in_dst ss -ltn 2>/dev/null | grep -q ":$port " && break
    sleep 0.1
  done
  measure iperf3 in_src iperf3 -c "$ADDR_DST" -p "$port" -t "$secs" -J "$@"
  if [[ "$M_RC" != 0 ]]; then
    # The server would wait for a client that never comes.
    local p
    for p in $(ip netns pids "$NS_DST"); do
      [[ "$(cat /proc/"$p"/comm 2>/dev/null)" == iperf3 ]] && kill -TERM "$p"
    done
  fi
  wait "$server" 2>/dev/null
  local scpu=0
  if [[ -s "$WORK/iperf3-server.times" ]]; then
    local u s
    read -r u s < <(tail -1 "$WORK/iperf3-server.times")
    scpu=$(add "$(_tsec "$u")" "$(_tsec "$s")")
  fi
  local parsed
  if [[ "$M_RC" != 0 ]] || ! parsed=$(REPORT iperf3 "$WORK/iperf3.out" 2>&1); then
    result_error "$tool" "iperf3 failed: $(head -c 300 "$WORK/iperf3.out" "$WORK/iperf3.err" | tr '\n' ' ')"
    return
  fi
  local bytes rsecs sent retrans
  read -r bytes rsecs sent retrans <<<"$parsed"
  rsecs=$(printf '%.3f' "$rsecs")
  # Memory to memory: there are no files to digest, so "verified" is null
  # (never claimed) and the note says why.
  result "$tool" "$bytes" "$rsecs" "$(add "$M_CPU" "$scpu")" null \
    "retransmits=$retrans" "sent_bytes=$sent" "note=$(jstr "memory to memory, no files to verify")"
}
