#!/usr/bin/env python3
"""Makes incompressible benchmark data (standard library only).

  gen_data.py files DIR COUNT SIZE           COUNT files f0..fN of SIZE bytes
  gen_data.py tree DIR DIRS FILES SIZE       DIRS directories d000.. of FILES files each
  gen_data.py dcp DIR RANKS SHARD_SIZE       a PyTorch-DCP-shaped checkpoint
"""
import os
import subprocess
import sys

CHUNK = 4 << 20

# AES-CTR over zeros: incompressible and about 5x faster than os.urandom.
_STREAM = subprocess.Popen(
    ["openssl", "enc", "-aes-128-ctr", "-nosalt", "-pbkdf2", "-pass",
     "pass:" + os.urandom(16).hex(), "-in", "/dev/zero"],
    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def write_random(path, size):
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(CHUNK, left)
            f.write(_STREAM.stdout.read(n))
            left -= n


def main(argv):
    kind, root = argv[1], argv[2]
    os.makedirs(root, exist_ok=True)
    if kind == "files":
        count, size = int(argv[3]), int(argv[4])
        for i in range(count):
            write_random(os.path.join(root, f"f{i}.bin"), size)
    elif kind == "tree":
        dirs, files, size = int(argv[3]), int(argv[4]), int(argv[5])
        for d in range(dirs):
            sub = os.path.join(root, f"d{d:03d}")
            os.makedirs(sub, exist_ok=True)
            for i in range(files):
                write_random(os.path.join(sub, f"f{i:05d}.bin"), size)
    elif kind == "dcp":
        ranks, shard = int(argv[3]), int(argv[4])
        for r in range(ranks):
            write_random(os.path.join(root, f"__{r}_0.distcp"), shard)
        write_random(os.path.join(root, ".metadata"), 64 << 10)
        extra = os.path.join(root, "extra_state")
        os.makedirs(extra, exist_ok=True)
        for r in range(ranks):
            write_random(os.path.join(extra, f"rank{r}.pt"), 4096)
    else:
        raise SystemExit(f"unknown kind {kind}")


if __name__ == "__main__":
    try:
        main(sys.argv)
    finally:
        _STREAM.kill()
        _STREAM.wait()
