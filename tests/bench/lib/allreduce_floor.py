#!/usr/bin/env python3
"""The transport floor of the allreduce scenario: the bytes a bandwidth-optimal
all-reduce puts on each uplink, sent by plain kernel TCP through the same star,
with no TLS, no daemon, no reduction and no copies.

    allreduce_floor.py site --index K --addrs A1,A2,... --bytes B --rounds R \
        --start T0 --period P --out F
    allreduce_floor.py merge OUT_1 ... OUT_N

Each site keeps one connection to every peer (as the daemons' links do) and,
per round, sends 2 x B / N bytes to every peer at once: the reduce-scatter's
and the all-gather's share of a B-byte buffer. A round ends when the last
site has received everything from every peer. The round time is what the
machine and the emulator allow before longhaul adds any work of its own:
where it is already above the target, the emulator and the machine, not the
algorithm, are the limit (docs/benchmarks.md, allreduce).
"""

import argparse
import json
import socket
import statistics
import sys
import threading

import rounds as rounds_lib

PORT = 7810


def site(args):
    addrs = args.addrs.split(",")
    n, me = len(addrs), args.index
    per_peer = 2 * args.bytes // n
    listener = socket.create_server((addrs[me], PORT), backlog=n)
    inbound = {}

    def accept_all():
        for _ in range(n - 1):
            conn, _ = listener.accept()
            inbound[conn.recv(1)[0]] = conn

    acceptor = threading.Thread(target=accept_all)
    acceptor.start()
    outbound = {}
    for k in range(n):
        if k == me:
            continue
        for _ in range(100):  # the peer's listener may not be up yet
            try:
                outbound[k] = socket.create_connection((addrs[k], PORT), timeout=30)
                break
            except OSError:
                rounds_lib.sleep_until(rounds_lib.now() + 0.1)
        else:
            sys.exit(f"site {me}: cannot connect to {addrs[k]}:{PORT}")
        outbound[k].sendall(bytes([me]))
    acceptor.join()
    payload = memoryview(bytearray(per_peer))
    finished = {}

    def send(k):
        outbound[k].sendall(payload)

    def receive(k):
        buf, got = bytearray(1 << 20), 0
        while got < per_peer:
            m = inbound[k].recv_into(buf, min(len(buf), per_peer - got))
            if m == 0:
                raise ConnectionError(f"site {k} closed its connection")
            got += m
        finished[k] = rounds_lib.now()

    times = []
    for r in range(args.rounds):
        start = args.start + r * args.period
        rounds_lib.sleep_until(start)
        threads = [threading.Thread(target=send, args=(k,)) for k in outbound]
        threads += [threading.Thread(target=receive, args=(k,)) for k in inbound]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if len(finished) != n - 1:
            sys.exit(f"site {me}: round {r} incomplete")
        times.append(max(finished.values()) - start)
        finished.clear()
    with open(args.out, "w") as f:
        json.dump({"site": me, "round_seconds": times}, f)


def merge(paths):
    per_site = [json.load(open(p))["round_seconds"] for p in paths]
    per_round = [max(s[r] for s in per_site) for r in range(len(per_site[0]))]
    print(json.dumps({"round_seconds": [round(t, 4) for t in per_round],
                      "median_seconds": statistics.median(per_round),
                      "min_seconds": min(per_round), "max_seconds": max(per_round)}))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("site")
    s.add_argument("--index", type=int, required=True)
    s.add_argument("--addrs", required=True)
    s.add_argument("--bytes", type=int, required=True)
    s.add_argument("--rounds", type=int, required=True)
    s.add_argument("--start", type=float, required=True, help="CLOCK_MONOTONIC of round 0")
    s.add_argument("--period", type=float, required=True)
    s.add_argument("--out", required=True)
    m = sub.add_parser("merge")
    m.add_argument("outs", nargs="+")
    args = p.parse_args()
    if args.cmd == "site":
        site(args)
    else:
        merge(args.outs)


if __name__ == "__main__":
    main()
