#!/usr/bin/env bash
# A seeded fault campaign against three local sites (see tests/chaos/README.md).
#   tests/chaos/run.sh [--minutes M] [--seed S] [--transport tcp|udp] [--json PATH]
#                      [--no-emulator] [--kinds kill,stop,...] [--keep]
# Prints the summary and writes it as JSON (default build/chaos-SEED-TRANSPORT.json).
# Exits 1 on any violation, after printing the seed and the command that
# replays it. Needs root for the link emulator and the small file systems;
# without root those faults are skipped, and the summary says so.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export LONGHAUL_BIN=${LONGHAUL_BIN:-$root/build/bin}
export PYTHONPATH=${LONGHAUL_PYTHONPATH:-$root/build/python}${PYTHONPATH:+:$PYTHONPATH}
export PYTHONDONTWRITEBYTECODE=1
args=("$@")
seed=1 transport=tcp json=""
while [ $# -gt 0 ]; do
  case $1 in
    --seed) seed=$2; shift ;;
    --transport) transport=$2; shift ;;
    --json) json=$2; shift ;;
  esac
  shift
done
if [ -z "$json" ]; then
  mkdir -p "$root/build"
  args+=(--json "$root/build/chaos-$seed-$transport.json")
fi
cd "$root/tests/chaos"
exec nice -n 5 /usr/bin/python3 campaign.py "${args[@]}"
