#!/usr/bin/env python3
"""Load test: N concurrent small transfers while a client polls status.

Two local daemons (deploy/local-sites.sh, via tests/integration/lh.py). The
test submits LOAD_TRANSFERS (default 200) small transfers from site-a to
site-b at once, while a poller thread calls `longhaul status --json` and
`longhaul ls --json` in a loop and times each call, and a scraper reads
site-a's /metrics. It asserts that every transfer completes byte-identical,
and reports the control-call p99 (gated against LOAD_P99_MS, default 100 ms,
only with LOAD_ENFORCE_P99=1: a timed figure) and the daemons' peak RSS.

The asserted figure is the control RPC itself: a poller holds one client
connection (the Python binding, as a training job would) and times each
`Get`. Calls through the CLI (`ls`, `status`: process start, connect, one
RPC, print) are timed too and reported beside it, with an idle baseline.
`peers` is left out: it dials the peer (a TLS handshake) by design.

Environment: LONGHAUL_BIN (the build's bin/), LOAD_TRANSFERS, LOAD_P99_MS,
LOAD_MAX_ACTIVE (transfer.max_active, default: the daemon's default).
"""

import json
import os
import re
import sys
import threading
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "integration"))
import lh  # noqa: E402
import longhaul  # noqa: E402  (the binding; PYTHONPATH points at build/python)

TRANSFERS = int(os.environ.get("LOAD_TRANSFERS", "200"))
P99_MS = float(os.environ.get("LOAD_P99_MS", "100"))
MAX_ACTIVE = os.environ.get("LOAD_MAX_ACTIVE", "")


def percentile(values, p):
    s = sorted(values)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, int(round(p / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


def vm_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def metrics_port(log_text):
    m = re.search(r"metrics on http://[^:]+:(\d+)/metrics", log_text)
    return int(m.group(1)) if m else None


class LoadTest(unittest.TestCase):
    def setUp(self):
        extra = "metrics: {listen: 127.0.0.1:0}\n"
        if MAX_ACTIVE:
            extra += f"transfer: {{max_active: {MAX_ACTIVE}}}\n"
        self.sites = lh.Sites(extra)
        self.addCleanup(self.sites.cleanup)
        self.sites.up()

    def timed_calls(self, calls, stop, out):
        i = 0
        while not stop.is_set():
            args = calls[i % len(calls)]()
            i += 1
            t0 = time.monotonic()
            proc = self.sites.cli("a", *args)
            out.append(((time.monotonic() - t0) * 1000.0, proc.returncode))

    def test_small_transfers_with_polling(self):
        s = self.sites
        src = s.path("src")
        for i in range(TRANSFERS):
            lh.write_random(os.path.join(src, f"t{i:03d}", "data.bin"), 64 << 10, seed=i)
            lh.write_random(os.path.join(src, f"t{i:03d}", "meta.json"), 300, seed=10000 + i)

        # Baseline: the same calls on idle daemons.
        baseline = []
        for _ in range(30):
            t0 = time.monotonic()
            s.cli("a", "ls", "--json", check=True)
            baseline.append((time.monotonic() - t0) * 1000.0)

        ids = []
        lock = threading.Lock()

        def submit(range_):
            for i in range_:
                proc, status = s.cp(os.path.join(src, f"t{i:03d}"), f"site-b:/ckpt/load/t{i:03d}",
                                    wait=False)
                if proc.returncode != 0 or status is None:
                    raise AssertionError(f"submit {i}: {proc.stderr}")
                with lock:
                    ids.append(status["id"])

        polls = []
        stop = threading.Event()
        poll_calls = [
            lambda: ["ls", "--json"],
            lambda: ["status", ids[-1], "--json"] if ids else ["ls", "--json"],
        ]
        poller = threading.Thread(target=self.timed_calls, args=(poll_calls, stop, polls))
        rpcs = []
        rpc_failures = []

        def poll_rpc():
            client = longhaul.Client(s.env["LONGHAUL_SITE_A"])
            while not stop.is_set():
                with lock:
                    known = list(ids[-8:])
                if not known:
                    time.sleep(0.005)
                    continue
                for tid in known:
                    t0 = time.monotonic()
                    try:
                        client.get(tid)
                    except Exception as e:  # noqa: BLE001 - counted and reported
                        rpc_failures.append(str(e))
                    rpcs.append((time.monotonic() - t0) * 1000.0)
                time.sleep(0.01)

        rpc_poller = threading.Thread(target=poll_rpc)
        scrapes = []
        port_a = metrics_port(s.log("site-a"))
        peer_bytes = []

        def scrape():
            while not stop.is_set() and port_a:
                t0 = time.monotonic()
                body = urllib.request.urlopen(f"http://127.0.0.1:{port_a}/metrics", timeout=5).read()
                scrapes.append((time.monotonic() - t0) * 1000.0)
                m = re.search(rb'longhaul_peer_bytes_sent_total\{peer="site-b"\} (\d+)', body)
                if m:
                    peer_bytes.append(int(m.group(1)))
                time.sleep(0.2)

        scraper = threading.Thread(target=scrape)
        poller.start()
        scraper.start()
        rpc_poller.start()
        self.addCleanup(lambda: (stop.set(), poller.join(), scraper.join(), rpc_poller.join()))

        t_submit = time.monotonic()
        submitters = [threading.Thread(target=submit, args=(range(k, TRANSFERS, 8),)) for k in range(8)]
        for t in submitters:
            t.start()
        for t in submitters:
            t.join()
        submit_s = time.monotonic() - t_submit
        self.assertEqual(len(ids), TRANSFERS)

        rss_peak = {"site-a": 0, "site-b": 0}
        deadline = time.time() + 600
        states = {}
        while time.time() < deadline:
            out = s.cli("a", "ls", "--all", "--json", check=True).stdout
            states = {t["id"]: t["state"] for t in json.loads(out)["transfers"]}
            for site in rss_peak:
                rss_peak[site] = max(rss_peak[site], vm_kib(s.pid(site), "VmRSS"))
            if all(states.get(i) in ("COMPLETED", "FAILED", "CANCELLED") for i in ids):
                break
            time.sleep(0.25)
        all_s = time.monotonic() - t_submit
        stop.set()
        poller.join()
        scraper.join()
        rpc_poller.join()

        not_done = {i: states.get(i) for i in ids if states.get(i) != "COMPLETED"}
        self.assertEqual(not_done, {}, "transfers that did not complete")
        for i in range(0, TRANSFERS, 37):
            self.assertEqual(lh.tree_digest(os.path.join(src, f"t{i:03d}")),
                             lh.tree_digest(os.path.join(s.export("site-b"), "load", f"t{i:03d}")))

        hwm = {site: vm_kib(s.pid(site), "VmHWM") for site in rss_peak}
        lat = [ms for ms, rc in polls]
        failures = sum(1 for _, rc in polls if rc != 0)
        report = {
            "rpc_calls": len(rpcs),
            "rpc_p50_ms": round(percentile(rpcs, 50), 2),
            "rpc_p99_ms": round(percentile(rpcs, 99), 2),
            "rpc_max_ms": round(max(rpcs), 2) if rpcs else None,
            "transfers": TRANSFERS,
            "max_active": MAX_ACTIVE or "default",
            "submit_seconds": round(submit_s, 2),
            "all_complete_seconds": round(all_s, 2),
            "control_calls": len(lat),
            "control_call_failures": failures,
            "control_p50_ms": round(percentile(lat, 50), 1),
            "control_p99_ms": round(percentile(lat, 99), 1),
            "control_max_ms": round(max(lat), 1) if lat else None,
            "idle_baseline_p50_ms": round(percentile(baseline, 50), 1),
            "idle_baseline_p99_ms": round(percentile(baseline, 99), 1),
            "metrics_scrapes": len(scrapes),
            "metrics_scrape_p99_ms": round(percentile(scrapes, 99), 1) if scrapes else None,
            "metrics_peer_bytes_sent_first_last": [peer_bytes[0], peer_bytes[-1]] if peer_bytes else None,
            "peak_rss_mib_vmhwm": {k: round(v / 1024, 1) for k, v in hwm.items()},
            "peak_rss_mib_sampled": {k: round(v / 1024, 1) for k, v in rss_peak.items()},
        }
        print("LOAD REPORT " + json.dumps(report), flush=True)
        self.assertEqual(failures, 0, "CLI control calls failed under load")
        self.assertEqual(rpc_failures, [], "control RPCs failed under load")
        self.assertGreater(len(rpcs), 100, "too few control calls to compute a p99")
        # A latency bound is a benchmark figure, not a pass/fail unit check
        # (STYLE.md): CI reports it; LOAD_ENFORCE_P99=1 makes it gate.
        if os.environ.get("LOAD_ENFORCE_P99") == "1":
            self.assertLess(percentile(rpcs, 99), P99_MS, f"control-call p99 over {P99_MS} ms: {report}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
