#!/usr/bin/env python3
"""Renders run.sh --json results as the markdown tables of docs/benchmarks.md.

    tests/bench/lib/table.py out/*.json > table.md

Each scenario gets its link, then one row per tool with goodput, time, CPU
(all of it, then each longhaul daemon's: sender/receiver seconds and seconds
per GiB), verification, and the longhaul/anchor ratio against every anchor
that ran.
"""

import json
import sys


def fmt(v, spec="{:.1f}"):
    return "–" if v is None else spec.format(v)


def pair(r, a, b):
    """"A/B" of two fields of row r to 2 decimals, or "–" when the row has neither."""
    if a not in r and b not in r:
        return "–"
    return f"{fmt(r.get(a), '{:.2f}')}/{fmt(r.get(b), '{:.2f}')}"


def main(paths):
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        link = d.get("link", {})
        desc = ", ".join(f"{k} {v}" for k, v in link.items() if k not in ("emulator", "kind"))
        extras = {k: v for k, v in d.items() if k not in ("scenario", "link", "results")}
        print(f"\n**{d['scenario']}** ({link.get('kind', '')}{'; ' + desc if desc else ''})"
              + (f" — {json.dumps(extras)}" if extras else "") + "\n")
        print("| tool | goodput Mbit/s | seconds | CPU s | CPU s tx/rx | CPU s/GiB tx/rx | verified | note |")
        print("|---|---|---|---|---|---|---|---|")
        rows = d.get("results", [])
        for r in rows:
            if "error" in r:
                print(f"| {r['tool']} | – | – | – | – | – | – | error: {r['error'][:120]} |")
                continue
            verified = {True: "yes", False: "NO", None: "n/a"}[r.get("verified")]
            note = ""
            if r["tool"].startswith("longhaul"):
                ratios = [f"{r['goodput_mbit'] / a['goodput_mbit']:.2f}× {a['tool']}"
                          for a in rows if not a["tool"].startswith("longhaul") and
                          a.get("goodput_mbit") and "error" not in a and
                          a.get("sites") == r.get("sites")]  # allreduce: same star only
                note = ", ".join(ratios)
                if "resent_bytes" in r:
                    note += f"; resent {r['resent_bytes']}"
            for key in ("share", "jain", "resent_ratio", "ideal_seconds", "median_ms", "ratio_to_ideal",
                        "ratio_to_alone", "peak_hwm_mib", "peak_threads", "peak_fds"):
                if key in r:
                    note += f" {key}={r[key]}"
            print(f"| {r['tool']} | {fmt(r.get('goodput_mbit'))} | {fmt(r.get('seconds'), '{:.2f}')} "
                  f"| {fmt(r.get('cpu_seconds'), '{:.2f}')} "
                  f"| {pair(r, 'cpu_seconds_sender', 'cpu_seconds_receiver')} "
                  f"| {pair(r, 'cpu_seconds_per_gib_sender', 'cpu_seconds_per_gib_receiver')} "
                  f"| {verified} | {note.strip()} |")


if __name__ == "__main__":
    main(sys.argv[1:])
