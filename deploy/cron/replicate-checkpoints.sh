#!/usr/bin/env bash
# Replicates a training run's finished checkpoints to another site. For cron
# (see longhaul-replicate.cron); safe to run as often as you like.
#
#   replicate-checkpoints.sh RUN_DIR SITE:/EXPORT/PATH
#
# RUN_DIR holds one directory per checkpoint (step-000100, step-000200, ...,
# names that sort in step order). The newest LONGHAUL_LAST (default 3) of
# them whose commit marker LONGHAUL_MARKER (default .metadata, as PyTorch DCP
# writes last) exists are synced to PATH/NAME at the destination; a checkpoint
# still being written has no marker yet and is left for the next run.
#
# - Idempotent: `longhaul sync` sends only files that changed, and the request
#   id is derived from the checkpoint and its marker, so a run that finds a
#   transfer of the same checkpoint still going attaches to it instead of
#   starting another.
# - Overlapping runs: a second run on the same host waits for the lock for
#   LONGHAUL_LOCK_WAIT seconds (default 0: skip and exit 0).
# - Exit status: 0 if every selected checkpoint is at the destination,
#   1 if one failed (cron mails the output), 2 on usage errors.
#
# Extra `longhaul sync` flags go in LONGHAUL_SYNC_FLAGS (e.g. "--streams 16").
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 RUN_DIR SITE:/EXPORT/PATH" >&2
  exit 2
fi
run_dir=${1%/}
dest=${2%/}
marker=${LONGHAUL_MARKER:-.metadata}
last=${LONGHAUL_LAST:-3}
longhaul=${LONGHAUL_CLI:-longhaul}
lock=${LONGHAUL_LOCK:-${XDG_RUNTIME_DIR:-/tmp}/longhaul-replicate-$(echo "$run_dir $dest" | md5sum | cut -c1-12).lock}

if [ ! -d "$run_dir" ]; then
  echo "replicate: $run_dir is not a directory" >&2
  exit 2
fi

exec 9>"$lock"
if ! flock -w "${LONGHAUL_LOCK_WAIT:-0}" 9; then
  echo "replicate: another run for $run_dir -> $dest holds $lock; skipping"
  exit 0
fi

mapfile -t checkpoints < <(find "$run_dir" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | LC_ALL=C sort)
selected=()
for ((i = ${#checkpoints[@]} - 1; i >= 0 && ${#selected[@]} < last; i--)); do
  name=${checkpoints[i]}
  if [ -e "$run_dir/$name/$marker" ]; then
    selected+=("$name")
  else
    echo "replicate: $name has no $marker yet (still being written?); not sent"
  fi
done

status=0
for name in "${selected[@]}"; do
  # Same checkpoint and same marker -> same request id -> same transfer.
  stamp=$(stat -c '%Y.%i' "$run_dir/$name/$marker")
  request_id="cron-$(echo "$dest/$name@$stamp" | md5sum | cut -c1-24)"
  # shellcheck disable=SC2086  # LONGHAUL_SYNC_FLAGS is a list of flags
  if "$longhaul" sync --wait --priority checkpoint --request-id "$request_id" \
      ${LONGHAUL_SYNC_FLAGS:-} "$run_dir/$name" "$dest/$name"; then
    echo "replicate: $name is at $dest/$name"
  else
    echo "replicate: $name FAILED (exit $?)" >&2
    status=1
  fi
done
exit $status
