#!/usr/bin/env bash
# The README's main job: two site daemons on this machine replicate a ~1 GiB
# PyTorch-DCP-shaped checkpoint from site-a to site-b with a live progress bar,
# verify it, print a summary and stop the daemons.
# LONGHAUL_DEMO_DIR (default /tmp/longhaul-demo) holds the sites and the sample;
# LONGHAUL_DEMO_SHARD_MIB (default 128) sizes each of the 8 shards.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${LONGHAUL_DEMO_DIR:-/tmp/longhaul-demo}
shard_mib=${LONGHAUL_DEMO_SHARD_MIB:-128}

echo "==> building longhaul (first run installs Debian packages; this takes a while)"
"$root/deploy/build.sh" --target longhauld longhaul >/dev/null

mkdir -p "$dir"
trap '"$root/deploy/local-sites.sh" down "$dir"' EXIT
echo "==> starting site-a and site-b (certificates in $dir/pki)"
eval "$("$root/deploy/local-sites.sh" up "$dir")"

sample=$dir/sample/step-1000
if [ ! -f "$sample/.metadata" ] || [ "$(stat -c %s "$sample/__0_0.distcp")" != $((shard_mib << 20)) ]; then
  echo "==> generating a sample checkpoint: 8 x ${shard_mib} MiB shards, .metadata, 8 small files"
  rm -rf "$dir/sample"
  mkdir -p "$sample/extra"
  for i in $(seq 0 7); do
    head -c $((shard_mib << 20)) /dev/urandom >"$sample/__${i}_0.distcp"
    head -c 4096 /dev/urandom >"$sample/extra/rng_state_$i.bin"
  done
  head -c 65536 /dev/urandom >"$sample/.metadata"
fi

dest=$dir/site-b/ckpt/step-1000
rm -rf "$dest"
echo "==> replicating $sample -> site-b:/ckpt/step-1000"
id=$("$root/build/bin/longhaul" --daemon "$LONGHAUL_SITE_A" cp "$sample" site-b:/ckpt/step-1000)
"$root/build/bin/longhaul" --daemon "$LONGHAUL_SITE_A" status "$id" --watch

echo "==> verifying"
"$root/build/bin/longhaul" --daemon "$LONGHAUL_SITE_A" verify "$id"
(cd "$sample" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$dir/src.sha256"
(cd "$dest" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$dir/dst.sha256"
if ! cmp -s "$dir/src.sha256" "$dir/dst.sha256"; then
  echo "demo: destination differs from the source (sha256)" >&2
  exit 1
fi
echo "    sha256 of all $(wc -l <"$dir/src.sha256") files match"

echo "==> summary"
"$root/build/bin/longhaul" --daemon "$LONGHAUL_SITE_A" --json status "$id"
echo "demo: OK. site-b's copy is at $dest"
