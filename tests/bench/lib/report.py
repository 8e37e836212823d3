#!/usr/bin/env python3
"""Result bookkeeping for tests/bench/run.sh (standard library only).

  report.py row FILE key=json ...        append one result row (values are JSON)
  report.py delta BEFORE AFTER           emulator counters AFTER - BEFORE, as JSON
  report.py iperf3 FILE                  "bytes seconds sent_bytes retransmits" from iperf3 -J
  report.py get FILE key                 a top-level field of a JSON object file
  report.py final SCENARIO LINK ROWS EXTRA [OUT]
                                         print the table; write the JSON object to OUT
"""
import json
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def row(path, pairs):
    obj = {}
    for p in pairs:
        k, _, v = p.partition("=")
        obj[k] = json.loads(v)
    with open(path, "a") as f:
        f.write(json.dumps(obj) + "\n")


def delta(before, after):
    try:
        b, a = load(before), load(after)
    except (OSError, ValueError):
        print("null")
        return
    keys = ("forwarded_packets", "forwarded_bytes", "dropped_queue",
            "dropped_loss", "dropped_cut", "dropped_overflow")
    out = {}
    if "sites" in a:  # the N-site star: each site's uplink and downlink
        for i in range(1, a["sites"] + 1):
            s = f"site{i}"
            out[s] = {d: {k: a[s][d][k] - b[s][d].get(k, 0) for k in keys} for d in ("up", "down")}
    else:
        for d in ("a2b", "b2a"):
            out[d] = {k: a[d][k] - b[d].get(k, 0) for k in keys}
    print(json.dumps(out))


def iperf3(path):
    j = load(path)
    if "error" in j and "end" not in j:
        raise SystemExit(j["error"])
    end = j["end"]
    rx = end["sum_received"]
    tx = end["sum_sent"]
    print(rx["bytes"], rx["seconds"], tx["bytes"], tx.get("retransmits", 0))


def fmt(v, nd=1):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def pair(r, a, b, nd):
    """"A/B" of two fields of row r, or "-" when the row has neither."""
    if a not in r and b not in r:
        return "-"
    return f"{fmt(r.get(a), nd)}/{fmt(r.get(b), nd)}"


def final(scenario, link_path, rows_path, extra_path, out=None):
    link = load(link_path)
    rows = []
    try:
        with open(rows_path) as f:
            rows = [json.loads(l) for l in f if l.strip()]
    except OSError:
        pass
    extra = {}
    try:
        extra = load(extra_path)
    except (OSError, ValueError):
        pass
    obj = {"scenario": scenario, "link": link, "results": rows}
    obj.update(extra)
    print(f"scenario {scenario}: " + ", ".join(
        f"{k}={v}" for k, v in link.items() if not isinstance(v, dict)))
    head = ["tool", "goodput Mbit/s", "seconds", "cpu s", "cpu s tx/rx", "cpu s/GiB tx/rx",
            "bytes", "verified", "notes"]
    table = [head]
    for r in rows:
        if "error" in r:
            table.append([r["tool"], "-", "-", "-", "-", "-", "-", "-", "error: " + r["error"]])
            continue
        notes = []
        for k in ("share", "resent_ratio", "note", "resent_bytes", "resent_chunks_per_stream",
                  "retransmits", "ratio_to_alone", "sites", "ratio_to_ideal",
                  "peak_hwm_mib", "peak_threads", "peak_fds"):
            if k in r:
                notes.append(f"{k}={fmt(r[k], 3)}")
        if r.get("flood_held"):
            h = r["flood_held"]
            notes.append(f"flood held min/median/max={h['min']}/{fmt(h['median'], 0)}/{h['max']}")
        lc = r.get("link_counters")
        if lc and "a2b" not in lc:  # the star: per site, uplink
            notes.append("uplink fwd/q-drop " + " ".join(
                f"{s}={c['up']['forwarded_packets']}/{c['up']['dropped_queue']}"
                for s, c in lc.items()))
        elif lc:
            a = lc["a2b"]
            notes.append("link a2b fwd={} q-drop={} loss={}".format(
                a["forwarded_packets"], a["dropped_queue"], a["dropped_loss"]))
        table.append([r["tool"], fmt(r.get("goodput_mbit")), fmt(r.get("seconds"), 2),
                      fmt(r.get("cpu_seconds"), 2),
                      pair(r, "cpu_seconds_sender", "cpu_seconds_receiver", 2),
                      pair(r, "cpu_seconds_per_gib_sender", "cpu_seconds_per_gib_receiver", 2),
                      fmt(r.get("bytes"), 0),
                      fmt(r.get("verified")), "; ".join(notes)])
    widths = [max(len(str(t[i])) for t in table) for i in range(len(head))]
    for i, t in enumerate(table):
        print("  ".join(str(c).ljust(widths[j]) for j, c in enumerate(t)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for k, v in extra.items():
        print(f"{k}: {json.dumps(v)}")
    if out:
        with open(out, "w") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")


def main(argv):
    cmd = argv[1]
    if cmd == "row":
        row(argv[2], argv[3:])
    elif cmd == "delta":
        delta(argv[2], argv[3])
    elif cmd == "iperf3":
        iperf3(argv[2])
    elif cmd == "get":
        v = load(argv[2]).get(argv[3])
        print("" if v is None else (json.dumps(v) if isinstance(v, (dict, list)) else v))
    elif cmd == "final":
        final(argv[2], argv[3], argv[4], argv[5], argv[6] if len(argv) > 6 else None)
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv)
