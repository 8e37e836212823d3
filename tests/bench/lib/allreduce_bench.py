#!/usr/bin/python3
"""One site of the `allreduce` benchmark scenario (docs/benchmarks.md), through
the ExchangeGroup API of the Python binding (`import longhaul`), and the
harness's reference and summary.

N of these run at once, one per site namespace of the emulated star, each
talking to its own daemon. They join one group of all N sites, run one
untimed all-reduce (it dials the exchange links), agree on a start time (the
first member sends it to the others over the exchange), then run ROUNDS
timed rounds. Rounds start at the same instant of CLOCK_MONOTONIC at every
site (one clock for the whole machine, whatever the network namespace), a
fixed period apart; a round is an in-place float32 sum all-reduce of the
site's input. Each site records when its round started and when its call
returned; `merge` turns the N records into the round time "every site holds
the result" = max(done) - max(start).

A site's input is deterministic: float32 standard normals seeded by the site's
name, with the round number stamped into the first and last elements, so a
stale result fails the check. After each round (outside the timed part) the
site records the SHA-256 of its result, once the round's window is nearly
over (VERIFY_SECONDS before the next start), so that it never takes CPU from
sites still in the round. `reference` computes, for every
round, the same sum in numpy float32 in the group's member order (sorted site
names): the daemon accumulates in float32, in member order, one element at a
time (daemon/exchange/reduce.cc), so the reference is bit-identical to a
correct result. `merge` marks the run verified only if, in every round, every
site's digest equals the reference's.

    allreduce_bench.py run --daemon unix:SOCK --site S --sites S1,S2,S3 \
        --group G --bytes 67108864 --rounds 10 --period 2.5 --out FILE
    allreduce_bench.py reference --sites S1,S2,S3 --bytes B --rounds R --out REF
    allreduce_bench.py merge --reference REF FILE...       # -> JSON on stdout
"""

import argparse
import hashlib
import json
import statistics
import struct
import sys

import numpy as np

from rounds import daemon_cpu, now, own_cpu, sleep_until


# What the checksum of a result and the copy of the next input take, at
# most, of the end of a round's window.
VERIFY_SECONDS = 0.4


def base_input(site, count):
    seed = int.from_bytes(hashlib.sha256(f"allreduce/{site}".encode()).digest()[:8], "little")
    return np.random.default_rng(seed).standard_normal(count, dtype=np.float32)


def stamp(buf, site_index, rnd):
    """Writes this round's marks into `buf` (in place)."""
    buf[0] = np.float32(rnd + 1)
    buf[-1] = np.float32(-(rnd + 1) * (site_index + 1))


def digest(arr):
    return hashlib.sha256(memoryview(arr).cast("B")).hexdigest()


def run(args):
    import longhaul  # built into build/python; PYTHONPATH points there

    members = sorted(args.sites.split(","))
    me = members.index(args.site)
    count = args.bytes // 4
    t_join = now()
    group = longhaul.ExchangeGroup(args.daemon, args.group, members, timeout=args.join_timeout)
    join_seconds = now() - t_join
    order = list(group.members)
    base = base_input(args.site, count)
    buf = np.empty_like(base)

    # Warm-up (untimed): the first use of each link dials it (TLS handshake).
    np.copyto(buf, base)
    t0 = now()
    group.allreduce(buf, op="sum", timeout=args.op_timeout, tag="warm")
    warm = now() - t0

    # Start time: chosen by the first member, sent to each of the others.
    if me == 0:
        t_start = now() + 0.5
        msg = np.frombuffer(struct.pack("<d", t_start), np.uint8)
        for peer in members[1:]:
            group.send(peer, "t0", msg, timeout=args.op_timeout)
    else:
        got = np.empty(8, np.uint8)
        group.recv(members[0], "t0", got, timeout=args.op_timeout)
        t_start = struct.unpack("<d", got.tobytes())[0]

    rounds = []
    cpu0 = own_cpu() + daemon_cpu(args.daemon_pid)
    t = t_start
    np.copyto(buf, base)
    stamp(buf, me, 0)
    for r in range(args.rounds):
        start = max(t, now())
        sleep_until(start)
        work = group.allreduce(buf, op="sum", timeout=args.op_timeout, tag=f"r{r}", async_op=True)
        work.wait()
        done = now()
        stats = work.stats()
        # The other sites may still be in this round: the checksum and the
        # next round's input wait for the end of the round's window, so
        # that the harness takes no CPU from the sites still running it.
        sleep_until(t + args.period - VERIFY_SECONDS)
        rounds.append({"start": start, "scheduled": t, "done": done, "digest": digest(buf),
                       "bytes_sent": int(stats.get("bytes_sent", 0)),
                       "bytes_received": int(stats.get("bytes_received", 0)),
                       "daemon_seconds": float(stats.get("seconds", 0))})
        np.copyto(buf, base)
        stamp(buf, me, r + 1)
        t += args.period
    cpu = own_cpu() + daemon_cpu(args.daemon_pid) - cpu0
    group.close()
    with open(args.out, "w") as f:
        json.dump({"site": args.site, "members": order, "join_seconds": join_seconds,
                   "warmup_seconds": warm, "cpu_seconds": cpu, "rounds": rounds}, f)


def reference(args):
    members = sorted(args.sites.split(","))
    count = args.bytes // 4
    bases = [base_input(s, count) for s in members]
    acc = np.empty(count, np.float32)
    out = []
    for r in range(args.rounds):
        for k, s in enumerate(members):
            x = bases[k]
            saved = (x[0], x[-1])
            stamp(x, k, r)
            # Member order, float32 accumulation: what the daemon does.
            if k == 0:
                np.copyto(acc, x)
            else:
                np.add(acc, x, out=acc)
            x[0], x[-1] = saved
        out.append(digest(acc))
    with open(args.out, "w") as f:
        json.dump({"members": members, "digests": out}, f)


def merge(args):
    ref = json.load(open(args.reference))
    recs = [json.load(open(p)) for p in args.files]
    times, late, ok, why = [], 0, True, []
    for rec in recs:
        if rec["members"] != ref["members"]:
            ok = False
            why.append(f"{rec['site']} reduced in order {rec['members']}, not {ref['members']}")
    nrounds = len(recs[0]["rounds"])
    for r in range(nrounds):
        per = [rec["rounds"][r] for rec in recs]
        start = max(x["start"] for x in per)
        end = max(x["done"] for x in per)
        if any(abs(x["start"] - x["scheduled"]) > 0.005 for x in per):
            late += 1  # a site started late (the previous round overran)
        times.append(end - start)
        digests = {x["digest"] for x in per}
        if len(digests) != 1:
            ok = False
            why.append(f"round {r}: the sites' results differ")
        elif digests != {ref["digests"][r]}:
            ok = False
            why.append(f"round {r}: the result differs from the reference")
    s = sorted(times)
    summary = {
        "rounds": nrounds,
        "median_seconds": statistics.median(times),
        "min_seconds": s[0],
        "max_seconds": s[-1],
        "p90_seconds": s[int(0.9 * (len(s) - 1))],
        "round_seconds": [round(x, 5) for x in times],
        "late_starts": late,
        "verified": ok,
        "why_not_verified": why[:5],
        "cpu_seconds": sum(rec["cpu_seconds"] for rec in recs),
        # What each site's daemon says it sent in the last round.
        "bytes_sent_per_site": {rec["site"]: rec["rounds"][-1]["bytes_sent"] for rec in recs},
        "warmup_seconds": {rec["site"]: round(rec["warmup_seconds"], 4) for rec in recs},
        "join_seconds": {rec["site"]: round(rec["join_seconds"], 4) for rec in recs},
    }
    json.dump(summary, sys.stdout)
    print()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--daemon", required=True)
    r.add_argument("--group", required=True)
    r.add_argument("--site", required=True)
    r.add_argument("--daemon-pid", type=int, default=0, help="for CPU accounting")
    r.add_argument("--period", type=float, required=True, help="seconds between round starts")
    r.add_argument("--out", required=True)
    r.add_argument("--join-timeout", type=float, default=60.0)
    r.add_argument("--op-timeout", type=float, default=120.0)
    f = sub.add_parser("reference")
    f.add_argument("--out", required=True)
    for q in (r, f):
        q.add_argument("--sites", required=True, help="every member, comma-separated")
        q.add_argument("--bytes", type=int, required=True, help="buffer size (a multiple of 4)")
        q.add_argument("--rounds", type=int, default=10)
    m = sub.add_parser("merge")
    m.add_argument("--reference", required=True)
    m.add_argument("files", nargs="+")
    args = p.parse_args()
    {"run": run, "reference": reference, "merge": merge}[args.cmd](args)


if __name__ == "__main__":
    main()
