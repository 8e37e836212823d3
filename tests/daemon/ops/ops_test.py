"""Metrics and operator rate caps on two running daemons."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "integration"))
import lh  # noqa: E402


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return r.status, r.headers.get("Content-Type"), r.read().decode()


def promtool():
    """Debian's promtool, unpacked from the `prometheus` package into
    BUILD/test-deps (downloaded once; `dpkg-deb -x` only: installing the
    package would start a Prometheus service). None, with the reason, when it
    cannot be had."""
    root = os.path.join(os.path.dirname(lh.BIN), "test-deps", "prometheus")
    tool = os.path.join(root, "usr", "bin", "promtool")
    if os.access(tool, os.X_OK):
        return tool, None
    with tempfile.TemporaryDirectory(prefix="lh-promtool-") as tmp:
        proc = subprocess.run(["apt-get", "download", "prometheus"], cwd=tmp,
                              capture_output=True, text=True)
        debs = [f for f in os.listdir(tmp) if f.endswith(".deb")]
        if proc.returncode != 0 or not debs:
            return None, f"apt-get download prometheus failed: {proc.stderr.strip()[-300:]}"
        unpacked = os.path.join(tmp, "root")
        subprocess.run(["dpkg-deb", "-x", os.path.join(tmp, debs[0]), unpacked], check=True)
        os.makedirs(os.path.dirname(root), exist_ok=True)
        shutil.rmtree(root, ignore_errors=True)
        shutil.move(unpacked, root)
    return tool, None


def sample(text, name, labels=""):
    m = re.search(r"^" + re.escape(name + labels) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


class OpsTest(lh.SitesTestCase):
    # Each daemon picks a free metrics port and logs it.
    extra_config = "metrics: {listen: 127.0.0.1:0}\n"

    def metrics_port(self, site):
        m = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", self.sites.log(site))
        self.assertIsNotNone(m, "no metrics log line")
        return int(m.group(1))

    def test_healthz_and_metrics_text(self):
        port = self.metrics_port("site-a")
        status, _, body = get(port, "/healthz")
        self.assertEqual((status, body), (200, "ok\n"))
        status, ctype, text = get(port, "/metrics")
        self.assertEqual(status, 200)
        self.assertEqual(ctype, "text/plain; version=0.0.4; charset=utf-8")
        for family in ["longhaul_bytes_sent_total", "longhaul_chunks_durable_total",
                       "longhaul_transfers", "longhaul_journal_write_seconds",
                       "longhaul_peer_rtt_seconds", "longhaul_peer_bandwidth_estimate_bytes_per_second",
                       "longhaul_peer_congestion_control_info"]:
            self.assertIn(f"# TYPE {family} ", text)
        self.assertEqual(sample(text, "longhaul_transfers", '{state="queued"}'), 0)
        with self.assertRaises(urllib.error.HTTPError) as e:
            get(port, "/nope")
        self.assertEqual(e.exception.code, 404)

    def test_per_peer_series_move_during_a_transfer_and_limit_changes_rate(self):
        s = self.sites
        src = s.path("src", "blob.bin")
        lh.write_random(src, 8 << 20, seed=7)
        # 16 Mbit/s = 2 MB/s: 8 MiB in 1 MiB chunks takes about 4 s.
        out = s.cli("a", "limit", "--peer", "site-b", "16Mbit", "--json", check=True).stdout
        self.assertEqual(json.loads(out), {"limits": [{"peer": "site-b", "bits_per_second": 16000000}]})
        port_a, port_b = self.metrics_port("site-a"), self.metrics_port("site-b")
        text = get(port_a, "/metrics")[2]
        self.assertEqual(sample(text, "longhaul_rate_limit_bytes_per_second",
                                '{scope="peer",name="site-b"}'), 2e6)

        start = time.monotonic()
        proc, status = s.cp(src, "site-b:/ckpt/blob.bin", "--chunk-size", "1MiB", "--streams", "2",
                            wait=False)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        sent = []
        while True:
            text = get(port_a, "/metrics")[2]
            v = sample(text, "longhaul_peer_bytes_sent_total", '{peer="site-b"}')
            if v is not None:
                sent.append(v)
            st = s.status("a", status["id"])
            if st["state"] in ("COMPLETED", "FAILED", "CANCELLED"):
                break
            time.sleep(0.3)
        elapsed = time.monotonic() - start
        self.assertEqual(st["state"], "COMPLETED", st)
        # The series moved while the transfer ran, in more than one step.
        self.assertGreaterEqual(len(set(sent)), 3, sent)
        self.assertEqual(sent, sorted(sent))
        # 8 MiB at 2 MB/s, less the 250 kB burst: at least ~3.5 s.
        self.assertGreater(elapsed, 3.0)
        text_b = get(port_b, "/metrics")[2]
        self.assertEqual(sample(text_b, "longhaul_chunks_durable_total"), 8)
        self.assertEqual(sample(text_b, "longhaul_bytes_durable_total"), 8 << 20)
        text = get(port_a, "/metrics")[2]
        self.assertEqual(sample(text, "longhaul_transfers", '{state="completed"}'), 1)
        self.assertGreater(sample(text, "longhaul_journal_write_seconds_count"), 0)
        self.assertIsNotNone(re.search(r'longhaul_peer_congestion_control_info\{peer="site-b",'
                                       r'algorithm="\w+"\} 1', text), text)

        # Lifted at run time: the same amount goes much faster.
        s.cli("a", "limit", "--peer", "site-b", "off", check=True)
        self.assertEqual(json.loads(s.cli("a", "limit", "--json", check=True).stdout), {"limits": []})
        lh.write_random(s.path("src", "blob2.bin"), 8 << 20, seed=8)
        start = time.monotonic()
        proc, st = s.cp(s.path("src", "blob2.bin"), "site-b:/ckpt/blob2.bin", "--chunk-size", "1MiB")
        self.assertEqual(st["state"], "COMPLETED", proc.stderr)
        self.assertLess(time.monotonic() - start, elapsed)

    def test_promtool_finds_no_lint(self):
        tool, why = promtool()
        if tool is None:
            self.skipTest(why)
        # Every family with a sample: a cap in force, a peer that carried data.
        self.sites.cli("a", "limit", "--peer", "site-b", "1Gbit", check=True)
        self.sites.cli("a", "limit", "--class", "background", "1Gbit", check=True)
        src = self.sites.path("src", "blob.bin")
        lh.write_random(src, 4 << 20, seed=9)
        proc, _ = self.sites.cp(src, "site-b:/ckpt/blob.bin", "--chunk-size", "1MiB")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        for site in ("site-a", "site-b"):
            text = get(self.metrics_port(site), "/metrics")[2]
            if site == "site-a":
                self.assertIn("longhaul_rate_limit_", text)
            check = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True,
                                   text=True)
            self.assertEqual((check.returncode, check.stdout + check.stderr), (0, ""),
                             f"promtool on {site}'s /metrics")

    def test_limit_refuses_unknown_peer_and_bad_rate(self):
        proc = self.sites.cli("a", "limit", "--peer", "site-z", "1Gbit")
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("'site-z' is not a configured peer site", proc.stderr)
        proc = self.sites.cli("a", "limit", "--peer", "site-b", "fast")
        self.assertEqual(proc.returncode, 2, proc.stderr)
        proc = self.sites.cli("a", "limit", "--class", "background", "100Mbit", "--json")
        self.assertEqual(json.loads(proc.stdout),
                         {"limits": [{"class": "background", "bits_per_second": 100000000}]})


if __name__ == "__main__":
    unittest.main()
