#!/usr/bin/env python3
"""The handshake flood of tests/bench/run.sh handshake-flood, the sampler of
the receiving daemon, and the summary of both over a time window. Standard
library only.

  handshake_flood.py flood --target HOST:PORT --connections N [--partial N]
      --source ADDR [--source ADDR ...] --ready-file FILE --out FILE
    Holds N TCP connections to HOST:PORT that never finish a TLS handshake:
    N - partial of them send nothing, `partial` send the first half of a real
    TLS 1.3 ClientHello and then nothing. Source addresses are used round
    robin. A connection the daemon closes (or refuses) is dialed again after
    --redial-delay seconds, so the flood keeps N pending for as long as it
    runs. With --max-hold S the flood itself closes and redials each
    connection S seconds after it was established (0: never). FILE ready appears once all N were established at the same time.
    Runs until SIGTERM/SIGINT, then writes its counts and the series of held
    connections (wall-clock seconds) to --out.

  handshake_flood.py sample --pid PID --out FILE [--interval S]
    Appends one JSON line per interval: VmRSS, VmHWM, RssAnon and Threads from
    /proc/PID/status and the number of open descriptors, until SIGTERM or
    until PID is gone (then a line {"t": ..., "gone": true}).

  handshake_flood.py window --samples FILE [--flood FILE] --from T0 --to T1
    Peaks of the samples in [T0, T1] (and the flood's held connections in
    it), as one JSON object.
"""

import argparse
import collections
import errno
import json
import os
import resource
import selectors
import signal
import socket
import ssl
import statistics
import sys
import threading
import time


def stop_on_signals():
    """An event that SIGTERM or SIGINT sets, for a loop to end on."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def client_hello_prefix():
    """The first half of the ClientHello a TLS 1.3 client sends: a record
    the server has to wait for the rest of."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="longhaul")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    hello = outgoing.read()
    if len(hello) < 10 or hello[0] != 0x16:
        raise SystemExit("could not build a ClientHello")
    return hello[: len(hello) // 2]


def raise_nofile(want):
    """Raises this process's descriptor limit to at least `want` (root may
    raise the hard limit too); returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= want:
        return soft
    if hard != resource.RLIM_INFINITY and hard < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            return want
        except (ValueError, OSError):
            want = hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return want


class Slot:
    __slots__ = ("index", "kind", "source", "sock", "state", "since", "due")

    def __init__(self, index, kind, source):
        self.index, self.kind, self.source = index, kind, source
        self.sock = None
        self.state = "idle"  # idle -> connecting -> held -> idle
        self.since = 0.0
        self.due = 0.0


def percentile(values, q):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def flood(args):
    host, _, port = args.target.rpartition(":")
    port = int(port)
    nofile = raise_nofile(args.connections + 256)
    if nofile < args.connections + 16:
        raise SystemExit(f"descriptor limit {nofile} is below {args.connections} connections")
    prefix = client_hello_prefix()
    slots = [Slot(i, "partial" if i < args.partial else "silent",
                  args.source[i % len(args.source)]) for i in range(args.connections)]
    sel = selectors.DefaultSelector()
    stop = stop_on_signals()

    counts = {"dials": 0, "established": 0, "closed_by_daemon": 0, "closed_by_flood": 0,
              "connect_timeouts": 0,
              "bytes_from_daemon": 0, "partial_hellos_sent": 0}
    connect_errors = {}
    hold_seconds = {"silent": [], "partial": []}
    series = []
    redial = collections.deque(slots)  # idle slots, by the time they are due
    held = 0
    ready_at = None
    t_start = time.time()

    def drop(slot, now):
        nonlocal held
        if slot.sock is not None:
            try:
                sel.unregister(slot.sock)
            except (KeyError, ValueError):
                pass
            slot.sock.close()
            slot.sock = None
        if slot.state == "held":
            held -= 1
        slot.state = "idle"
        slot.due = now + args.redial_delay
        redial.append(slot)

    def dial(slot, now):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.bind((slot.source, 0))
        except OSError as e:
            s.close()
            raise SystemExit(f"cannot bind {slot.source}: {e}")
        counts["dials"] += 1
        rc = s.connect_ex((host, port))
        slot.sock, slot.since = s, now
        if rc not in (0, errno.EINPROGRESS):
            connect_errors[errno.errorcode.get(rc, str(rc))] = (
                connect_errors.get(errno.errorcode.get(rc, str(rc)), 0) + 1)
            drop(slot, now)
            return
        slot.state = "connecting"
        sel.register(s, selectors.EVENT_WRITE, slot)

    def established(slot, now):
        nonlocal held
        err = slot.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            name = errno.errorcode.get(err, str(err))
            connect_errors[name] = connect_errors.get(name, 0) + 1
            drop(slot, now)
            return
        counts["established"] += 1
        slot.state, slot.since = "held", now
        held += 1
        if slot.kind == "partial":
            try:
                slot.sock.send(prefix)
                counts["partial_hellos_sent"] += 1
            except OSError:
                counts["closed_by_daemon"] += 1
                drop(slot, now)
                return
        sel.modify(slot.sock, selectors.EVENT_READ, slot)

    def readable(slot, now):
        try:
            data = slot.sock.recv(65536)
        except (ConnectionResetError, OSError):
            data = b""
        if data:
            counts["bytes_from_daemon"] += len(data)
            return
        counts["closed_by_daemon"] += 1
        hold_seconds[slot.kind].append(now - slot.since)
        drop(slot, now)

    next_sample = next_timeout_scan = t_start
    while not stop.is_set():
        now = time.time()
        while redial and redial[0].due <= now:
            dial(redial.popleft(), now)
        if now >= next_timeout_scan:
            for slot in slots:
                if slot.state == "connecting" and now - slot.since > args.connect_timeout:
                    counts["connect_timeouts"] += 1
                    drop(slot, now)
                elif slot.state == "held" and args.max_hold and now - slot.since > args.max_hold:
                    counts["closed_by_flood"] += 1
                    drop(slot, now)
            next_timeout_scan = now + 0.5
        if ready_at is None and held == args.connections:
            ready_at = now
            with open(args.ready_file, "w") as f:
                f.write(f"{now:.6f}\n")
        if now >= next_sample:
            connecting = sum(1 for s in slots if s.state == "connecting")
            series.append([round(now, 3), held, connecting])
            next_sample = now + 0.1
        try:
            events = sel.select(timeout=0.05)
        except InterruptedError:
            continue
        now = time.time()
        for key, mask in events:
            slot = key.data
            if slot.state == "connecting":
                established(slot, now)
            elif slot.state == "held" and mask & selectors.EVENT_READ:
                readable(slot, now)

    t_end = time.time()
    for slot in slots:
        if slot.sock is not None:
            slot.sock.close()

    def hold_summary(values):
        return {"n": len(values), "median": percentile(values, 0.5),
                "p10": percentile(values, 0.1), "p90": percentile(values, 0.9),
                "max": max(values) if values else None}

    out = {"target": args.target, "connections": args.connections, "partial": args.partial,
           "max_hold_seconds": args.max_hold,
           "silent": args.connections - args.partial, "sources": len(args.source),
           "client_nofile": nofile, "partial_hello_bytes": len(prefix),
           "started": round(t_start, 3), "ready_at": round(ready_at, 3) if ready_at else None,
           "stopped": round(t_end, 3), **counts, "connect_errors": connect_errors,
           "hold_seconds": {k: hold_summary(v) for k, v in hold_seconds.items()},
           "series": series}
    with open(args.out, "w") as f:
        json.dump(out, f)


def read_status(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "Threads"):
                fields[k] = int(v.split()[0])
    return fields


def sample(args):
    stop = stop_on_signals()
    with open(args.out, "a") as out:
        while not stop.is_set():
            now = time.time()
            try:
                st = read_status(args.pid)
                fds = len(os.listdir(f"/proc/{args.pid}/fd"))
            except (FileNotFoundError, ProcessLookupError):
                out.write(json.dumps({"t": round(now, 3), "gone": True}) + "\n")
                return
            # A zombie has no memory and no descriptors left to count.
            if "VmRSS" not in st:
                out.write(json.dumps({"t": round(now, 3), "gone": True}) + "\n")
                return
            out.write(json.dumps({"t": round(now, 3), "rss_kib": st["VmRSS"], "hwm_kib": st["VmHWM"],
                                  "anon_kib": st.get("RssAnon", 0), "threads": st["Threads"], "fds": fds}) + "\n")
            out.flush()
            time.sleep(args.interval)


def window(args):
    t0, t1 = args.from_, args.to
    samples = []
    with open(args.samples) as f:
        for line in f:
            if line.strip():
                samples.append(json.loads(line))
    inside = [s for s in samples if t0 <= s["t"] <= t1]
    live = [s for s in inside if not s.get("gone")]
    gone = next((s["t"] for s in samples if s.get("gone") and s["t"] <= t1), None)
    out = {"from": t0, "to": t1, "samples": len(live), "receiver_gone_at": gone}
    if live:
        out.update({
            "peak_hwm_mib": round(max(s["hwm_kib"] for s in live) / 1024, 1),
            "peak_rss_mib": round(max(s["rss_kib"] for s in live) / 1024, 1),
            "peak_anon_mib": round(max(s.get("anon_kib", 0) for s in live) / 1024, 1),
            "peak_threads": max(s["threads"] for s in live),
            "peak_fds": max(s["fds"] for s in live),
        })
    if args.flood:
        with open(args.flood) as f:
            fl = json.load(f)
        held = [h for t, h, _ in fl["series"] if t0 <= t <= t1]
        out["flood_held"] = {"min": min(held), "median": statistics.median(held),
                             "max": max(held)} if held else None
    print(json.dumps(out))


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("flood")
    f.add_argument("--target", required=True)
    f.add_argument("--connections", type=int, default=1000)
    f.add_argument("--partial", type=int, default=0)
    f.add_argument("--source", action="append", required=True)
    f.add_argument("--redial-delay", type=float, default=0.1)
    f.add_argument("--connect-timeout", type=float, default=10.0)
    f.add_argument("--max-hold", type=float, default=0.0)
    f.add_argument("--ready-file", required=True)
    f.add_argument("--out", required=True)
    s = sub.add_parser("sample")
    s.add_argument("--pid", type=int, required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--interval", type=float, default=0.1)
    w = sub.add_parser("window")
    w.add_argument("--samples", required=True)
    w.add_argument("--flood")
    w.add_argument("--from", dest="from_", type=float, required=True)
    w.add_argument("--to", type=float, required=True)
    args = p.parse_args(argv[1:])
    if args.cmd == "flood" and args.partial > args.connections:
        p.error("--partial exceeds --connections")
    {"flood": flood, "sample": sample, "window": window}[args.cmd](args)


if __name__ == "__main__":
    main(sys.argv)
