#!/usr/bin/env bash
# Installs the Debian 12 packages that longhaul's build, demo, tests and
# benchmarks need. Idempotent: packages already present are skipped, and
# nothing is fetched when everything is installed.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
  # libraries
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  librocksdb-dev libabsl-dev liburing-dev libboost-dev libssl-dev
  libxxhash-dev libyaml-cpp-dev libcli11-dev libspdlog-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # python binding and examples (Debian's /usr/bin/python3)
  pybind11-dev python3-dev python3-numpy python3-torch python3-cryptography
  # runtime tools: PKI, namespaces, benchmark anchors
  openssl iproute2 procps curl iperf3 rsync openssh-server openssh-client rclone
  iputils-ping
  # tests: loop-mounted ext4 exports (mkfs.ext4, losetup, mount)
  e2fsprogs mount
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: run as root (or install them yourself) and try again" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The benchmark harness starts its own sshd; the distribution's must not hold port 22.
if command -v systemctl >/dev/null 2>&1; then
  systemctl disable --now ssh >/dev/null 2>&1 || true
fi
