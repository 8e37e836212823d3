#!/usr/bin/env bash
# Installs the Debian 12 packages that longhaul's build, demo, tests and
# benchmarks need. Idempotent: packages already present are skipped, and
# nothing is fetched when everything is installed.
#
# It installs packages and does nothing else: no system service is started,
# stopped, enabled, disabled or reconfigured here, and no server is installed.
# The benchmark harness runs an sshd of its own inside its namespaces; it uses
# /usr/sbin/sshd when the machine has one, and otherwise unpacks the
# openssh-server package into build/ itself, without installing it
# (tests/bench/lib/anchors.sh). libwrap0 is that sshd's one library that
# openssh-client does not already bring.
set -euo pipefail

PACKAGES=(
  # toolchain
  build-essential cmake ninja-build pkg-config clang libclang-rt-14-dev
  # checks (deploy/check.sh): clang-format; clang and its TSan runtime above
  clang-format git
  # libraries
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  librocksdb-dev libabsl-dev liburing-dev libboost-dev libssl-dev
  libxxhash-dev libyaml-cpp-dev libcli11-dev libspdlog-dev
  prometheus-cpp-dev  # longhaul links its core only; it brings civetweb (no service)
  libgtest-dev libgmock-dev libbenchmark-dev
  # python binding and examples (Debian's /usr/bin/python3)
  pybind11-dev python3-dev python3-numpy python3-torch python3-cryptography
  # runtime tools: PKI, namespaces, benchmark anchors
  openssl iproute2 procps curl iperf3 rsync openssh-client rclone
  iputils-ping libwrap0
  # tests: loop-mounted ext4 exports (mkfs.ext4, losetup, mount)
  e2fsprogs mount
  # tests: the CLI drawn on a real terminal (tests/integration/test_cli.py)
  tmux
  # tests: longhaul-faultfs, the chaos campaign's FUSE file system (tests/chaos/faultfs)
  libfuse3-dev fuse3
  # tests: the install test renders the man pages (man -l) and reads the
  # packaged binaries' sections (readelf, binutils)
  man-db binutils
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
