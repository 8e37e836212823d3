#!/usr/bin/python3
"""One site of the `exchange` benchmark scenario (docs/benchmarks.md), through
the ExchangeGroup API of the Python binding (`import longhaul`).

Two of these run at once, one per site namespace, each talking to its own
daemon. They join a group, warm the exchange links up with one untimed round
per size, agree on a start time (site-a sends it over the exchange), then run
ROUNDS rounds per size. In a round both sites start at the same instant of
CLOCK_MONOTONIC (one clock for the whole machine, whatever the network
namespace), send their buffer to the other and receive the other's. Each
site records when its round started and when it had the peer's buffer and
its own send was done; `merge` turns the two records into the round time
"both sites hold each other's buffer" = max(done) - start.

Every buffer is checked byte for byte against what the peer must have sent:
the peer's seeded random bytes with the round number stamped at both ends,
so a stale or misdirected message fails the check.

    exchange_bench.py run --daemon unix:SOCK --site site-a --peer site-b \
        --group G --size big=67108864 --size small=4096 --rounds 20 --out FILE
    exchange_bench.py merge A.json B.json [--copies C.json]   # -> JSON on stdout
    exchange_bench.py copy-loop --daemon unix:SOCK --source FILE \
        --dest site-b:/ckpt/copy --stop-file F --out C.json

    exchange_bench.py raw --listen|--connect ADDR:PORT --site S --peer P ... --out FILE

raw is the anchor: the same rounds over one plain TCP connection (kernel BBR,
no TLS, no daemon, memory to memory), the ceiling of what the emulated link
and this machine allow for the same exchange.

copy-loop keeps a checkpoint-class `longhaul cp` of FILE running (one after
another, each to a fresh destination) until F exists, then cancels the one in
flight; it records when each copy ran, so `merge` can tell which rounds had a
copy moving data beside them.
"""

import argparse
import hashlib
import json
import os
import statistics
import struct
import sys
import time

import numpy as np

from rounds import daemon_cpu, now, own_cpu, sleep_until


def payload(site, size):
    seed = int.from_bytes(hashlib.sha256(f"{site}/{size}".encode()).digest()[:8], "little")
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def stamp(buf, rnd):
    """Writes the round number at both ends of `buf` (in place)."""
    tag = np.frombuffer(struct.pack("<Q", rnd + 1), np.uint8)
    n = min(8, buf.size // 2)
    buf[:n] = tag[:n]
    buf[buf.size - n:] = tag[:n]


# Seconds between round starts: enough for a slow round to end before the
# next one, at 1 Gbit/s and 40 ms RTT.
def period_for(size):
    return max(0.25, 2.5 * (size * 8 / 1e9) + 0.2)


class RawGroup:
    """A plain TCP connection with the send/recv shape the rounds use."""

    def __init__(self, args):
        import socket
        import threading
        self._threading = threading
        host, _, port = (args.listen or args.connect).rpartition(":")
        if args.listen:
            ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind((host, int(port)))
            ls.listen(1)
            ls.settimeout(args.join_timeout)
            self.sock, _ = ls.accept()
            ls.close()
        else:
            deadline = now() + args.join_timeout
            while True:
                try:
                    self.sock = socket.create_connection((host, int(port)), timeout=5)
                    break
                except OSError:
                    if now() > deadline:
                        raise
                    time.sleep(0.1)
        s = self.sock
        s.settimeout(None)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"bbr")
        except OSError:
            pass
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            s.setsockopt(socket.SOL_SOCKET, opt, args.raw_buffer)

    class _Work:
        def __init__(self, t):
            self.t = t

        def wait(self):
            self.t.join()

    def send(self, peer, tag, data, timeout=None, async_op=False):
        mv = memoryview(data).cast("B")
        if not async_op:
            self.sock.sendall(mv)
            return None
        t = self._threading.Thread(target=self.sock.sendall, args=(mv,))
        t.start()
        return RawGroup._Work(t)

    def recv(self, peer, tag, out, timeout=None):
        mv = memoryview(out).cast("B")
        got = 0
        while got < len(mv):
            n = self.sock.recv_into(mv[got:])
            if n == 0:
                raise RuntimeError("peer closed")
            got += n
        return got

    def close(self):
        self.sock.close()


def run(args):

    sizes = []
    for s in args.size:
        name, _, n = s.partition("=")
        sizes.append((name, int(n)))
    members = sorted([args.site, args.peer])
    t_join = now()
    if args.cmd == "raw":
        group = RawGroup(args)
    else:
        import longhaul  # built into build-*/python; PYTHONPATH points there
        group = longhaul.ExchangeGroup(args.daemon, args.group, members, timeout=args.join_timeout)
    join_seconds = now() - t_join
    mine = {name: payload(args.site, n) for name, n in sizes}
    theirs = {name: payload(args.peer, n) for name, n in sizes}
    out = {name: np.empty(n, np.uint8) for name, n in sizes}

    def exchange(name, tag):
        work = group.send(args.peer, tag, mine[name], timeout=args.op_timeout, async_op=True)
        got = group.recv(args.peer, tag, out[name], timeout=args.op_timeout)
        work.wait()
        return got

    # Warm-up (untimed): the first use of a link dials it (TLS handshake).
    warm = {}
    for name, n in sizes:
        stamp(mine[name], 1 << 40)
        t0 = now()
        exchange(name, f"warm-{name}")
        warm[name] = now() - t0

    # Start time: chosen by the first site, sent to the other over the exchange.
    if args.site == members[0]:
        t_start = now() + 0.5
        group.send(args.peer, "t0", np.frombuffer(struct.pack("<d", t_start), np.uint8),
                   timeout=args.op_timeout)
    else:
        buf = np.empty(8, np.uint8)
        group.recv(args.peer, "t0", buf, timeout=args.op_timeout)
        t_start = struct.unpack("<d", buf.tobytes())[0]

    result = {"site": args.site, "peer": args.peer, "join_seconds": join_seconds,
              "warmup_seconds": warm, "sizes": {}}
    t = t_start
    for name, n in sizes:
        period = period_for(n)
        rounds = []
        cpu0 = own_cpu() + daemon_cpu(args.daemon_pid)
        for r in range(args.rounds):
            stamp(mine[name], r)
            expected = theirs[name]
            stamp(expected, r)
            out[name].fill(0)
            start = max(t, now())
            sleep_until(start)
            got = exchange(name, f"{name}-{r}")
            done = now()
            ok = got == n and np.array_equal(out[name], expected)
            digest = hashlib.sha256(out[name].data).hexdigest()[:16] if r == args.rounds - 1 else None
            rounds.append({"start": start, "scheduled": t, "done": done, "ok": bool(ok),
                           "digest": digest})
            t += period
        cpu = own_cpu() + daemon_cpu(args.daemon_pid) - cpu0
        result["sizes"][name] = {"bytes": n, "rounds": rounds, "cpu_seconds": cpu}
        # Both sites move to the next size at the same agreed time.
    group.close()
    with open(args.out, "w") as f:
        json.dump(result, f)


def merge(paths, copies_path=None):
    recs = [json.load(open(p)) for p in paths]
    copies = json.load(open(copies_path)) if copies_path else None
    summary = {}
    for name in recs[0]["sizes"]:
        per = [r["sizes"][name]["rounds"] for r in recs]
        times, all_times, late, ok = [], [], 0, True
        for rounds in zip(*per):
            start = max(x["start"] for x in rounds)
            end = max(x["done"] for x in rounds)
            if any(abs(x["start"] - x["scheduled"]) > 0.005 for x in rounds):
                late += 1  # a site started late (the previous round overran)
            ok = ok and all(x["ok"] for x in rounds)
            all_times.append(end - start)
            # With a copy: count only rounds that ran wholly while a copy was
            # moving data (not in the gap between two copies).
            inf = float("inf")
            if copies is None or any(
                    (c["moving"] if c["moving"] is not None else inf) <= start and
                    end <= (c["end"] if c["end"] is not None else inf)
                    for c in copies["copies"]):
                times.append(end - start)
        if not times:
            times = [float("nan")]
        summary[name] = {
            "bytes": recs[0]["sizes"][name]["bytes"],
            "rounds": len(all_times),
            "rounds_counted": len(times),
            "median_seconds": statistics.median(times),
            "min_seconds": min(times),
            "max_seconds": max(times),
            "p90_seconds": sorted(times)[int(0.9 * (len(times) - 1))],
            "seconds": [round(t, 5) for t in all_times],
            "late_starts": late,
            "verified": ok,
            "cpu_seconds": sum(r["sizes"][name].get("cpu_seconds", 0) for r in recs),
        }
    summary["_warmup_seconds"] = {r["site"]: r["warmup_seconds"] for r in recs}
    if copies is not None:
        summary["_copies"] = copies
    json.dump(summary, sys.stdout)
    print()


def copy_loop(args):
    import longhaul

    client = longhaul.Client(args.daemon)
    copies = []

    def save():
        with open(args.out + ".tmp", "w") as f:
            json.dump({"copies": copies}, f)
        os.replace(args.out + ".tmp", args.out)

    i = 0
    while not os.path.exists(args.stop_file):
        dest = f"{args.dest}-{i}"
        t0 = now()
        st = client.submit([args.source], dest, priority="checkpoint")
        rec = {"id": st["id"], "dest": dest, "submitted": t0, "moving": None, "end": None,
               "state": None, "bytes_done": 0}
        copies.append(rec)
        while True:
            st = client.get(st["id"])
            if rec["moving"] is None and int(st.get("bytes_sent", 0)) > 0:
                # Data flows from here on; give the streams a moment to reach speed.
                rec["moving"] = now() + 0.5
                save()
                if i == 0:
                    time.sleep(1.0)
                    open(args.ready_file, "w").close()
            if st["state"] in ("COMPLETED", "FAILED", "CANCELLED"):
                break
            if os.path.exists(args.stop_file):
                client.cancel(st["id"])
            time.sleep(0.02)
        rec["end"] = now()
        rec["state"] = st["state"]
        rec["bytes_done"] = int(st.get("bytes_done", 0))
        if rec["moving"] is None:
            rec["moving"] = rec["end"]
        save()
        i += 1
        if st["state"] == "FAILED":
            break
    if not os.path.exists(args.ready_file):
        open(args.ready_file, "w").close()
    save()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--daemon", required=True)
    r.add_argument("--group", required=True)
    r.add_argument("--daemon-pid", type=int, default=0, help="for CPU accounting")
    raw = sub.add_parser("raw")
    how = raw.add_mutually_exclusive_group(required=True)
    how.add_argument("--listen", help="ADDR:PORT")
    how.add_argument("--connect", help="ADDR:PORT")
    raw.add_argument("--raw-buffer", type=int, default=10 << 20, help="SO_SNDBUF/SO_RCVBUF")
    raw.set_defaults(daemon_pid=0)
    for q in (r, raw):
        q.add_argument("--site", required=True)
        q.add_argument("--peer", required=True)
        q.add_argument("--size", action="append", required=True, help="NAME=BYTES")
        q.add_argument("--rounds", type=int, default=20)
        q.add_argument("--out", required=True)
        q.add_argument("--join-timeout", type=float, default=60.0)
        q.add_argument("--op-timeout", type=float, default=60.0)
    m = sub.add_parser("merge")
    m.add_argument("files", nargs=2)
    m.add_argument("--copies")
    c = sub.add_parser("copy-loop")
    c.add_argument("--daemon", required=True)
    c.add_argument("--source", required=True)
    c.add_argument("--dest", required=True, help="SITE:/EXPORT/PREFIX; copy i goes to PREFIX-i")
    c.add_argument("--stop-file", required=True)
    c.add_argument("--ready-file", required=True, help="written once the first copy moves data")
    c.add_argument("--out", required=True)
    args = p.parse_args()
    if args.cmd in ("run", "raw"):
        run(args)
    elif args.cmd == "merge":
        merge(args.files, args.copies)
    else:
        copy_loop(args)


if __name__ == "__main__":
    main()
