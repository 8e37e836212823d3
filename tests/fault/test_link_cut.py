"""A 30 s link cut through the WAN emulator (ctest labels `fault` and `wan`).

Two daemons in the emulator's namespaces; a transfer is running when the link
is black-holed for 30 s in both directions. After the restore the transfer
must go on by itself (no operator action), complete, and arrive identical.
Prints the figures: bytes moved during the cut, seconds from restore to the
first new progress, resent bytes.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import lh  # noqa: E402

WANEM = os.environ.get("LONGHAUL_WANEM", os.path.join(lh.BIN, "longhaul-wanem"))
CUT_SECONDS = float(os.environ.get("LONGHAUL_CUT_SECONDS", "30"))
MIB = 1 << 20


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class LinkCutTest(unittest.TestCase):

    def setUp(self):
        if os.geteuid() != 0 or not os.path.exists("/dev/net/tun"):
            self.skipTest("needs root and /dev/net/tun for the WAN emulator")
        self.dir = tempfile.mkdtemp(prefix="lh-cut-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.procs = []
        self.addCleanup(self.stop_all)
        self.start_link()
        subprocess.run(["bash", os.path.join(lh.ROOT, "deploy", "pki.sh"), self.path("pki"), "site-a", "site-b"],
                       check=True, capture_output=True)
        self.start_daemon("site-a", self.env["LHW_NS_A"], self.env["LHW_ADDR_A"], "site-b", self.env["LHW_ADDR_B"])
        self.start_daemon("site-b", self.env["LHW_NS_B"], self.env["LHW_ADDR_B"], "site-a", self.env["LHW_ADDR_A"])

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def start_link(self):
        ready = self.path("wanem.env")
        self.ctl = self.path("wanem.sock")
        with open(self.path("wanem.log"), "w") as out:
            wanem = subprocess.Popen([WANEM, "--rate=200Mbit", "--delay=10ms", "--queue=bdp", "--mtu=9000",
                                      f"--control={self.ctl}", f"--ready-file={ready}"],
                                     stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(wanem)
        deadline = time.time() + 20
        while time.time() < deadline and not (os.path.exists(ready) and os.path.getsize(ready) > 0):
            self.assertIsNone(wanem.poll(), open(self.path("wanem.log")).read())
            time.sleep(0.1)
        self.env = {}
        with open(ready) as f:
            for line in f:
                if "=" in line:
                    key, value = line.strip().removeprefix("export ").split("=", 1)
                    self.env[key] = value.strip("'\"")

    def start_daemon(self, site, ns, addr, peer, peer_addr):
        d = self.path(site)
        os.makedirs(os.path.join(d, "ckpt"))
        with open(os.path.join(d, "longhauld.yaml"), "w") as f:
            f.write(f"""site: {site}
listen: {addr}:7700
control_socket: {d}/control.sock
state_dir: {d}/state
tls: {{ca: {self.path('pki', 'ca.pem')}, cert: {self.path('pki', site + '.pem')}, key: {self.path('pki', site + '.key')}}}
exports: [{{name: ckpt, path: {d}/ckpt, writers: [{peer}]}}, {{name: local, path: {self.dir}}}]
peers: [{{site: {peer}, address: {peer_addr}:7700}}]
link: {{bandwidth: 200Mbit, rtt: 20ms}}
metrics: {{listen: "127.0.0.1:0"}}
""")
        with open(os.path.join(d, "longhauld.log"), "w") as out:
            proc = subprocess.Popen(["ip", "netns", "exec", ns, os.path.join(lh.BIN, "longhauld"), "--config",
                                     os.path.join(d, "longhauld.yaml")], stdout=out, stderr=subprocess.STDOUT)
        self.procs.insert(0, proc)  # daemons stop before the link
        deadline = time.time() + 20
        while time.time() < deadline and not os.path.exists(os.path.join(d, "control.sock")):
            self.assertIsNone(proc.poll(), self.log(site))
            time.sleep(0.1)

    def stop_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    def log(self, site):
        with open(self.path(site, "longhauld.log")) as f:
            return f.read()

    def cli(self, *args):
        cmd = [os.path.join(lh.BIN, "longhaul"), "--daemon", "unix:" + self.path("site-a", "control.sock"), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, f"{cmd}: {proc.stderr}")
        return proc.stdout

    def status(self, tid):
        return json.loads(self.cli("status", tid, "--json"))

    def wanem(self, command):
        subprocess.run([WANEM, "ctl", self.ctl, command], check=True, capture_output=True)

    def test_transfer_continues_by_itself_after_a_30s_cut(self):
        src = self.path("src.bin")
        lh.write_random(src, 256 * MIB, seed=30)
        # Rate-capped so the transfer is surely still running when the cut ends.
        self.cli("limit", "--peer", "site-b", "100Mbit")
        tid = self.cli("cp", src, "site-b:/ckpt/ckpt.bin", "--chunk-size", "4MiB").strip()
        deadline = time.time() + 60
        while self.status(tid)["bytes_done"] < 32 * MIB:
            self.assertLess(time.time(), deadline, self.log("site-a")[-2000:])
            time.sleep(0.2)

        self.wanem("cut")
        time.sleep(2)  # chunks already past the cut may still be acknowledged
        before = self.status(tid)
        cut_at = time.time()
        time.sleep(CUT_SECONDS - 2)
        during = self.status(tid)
        self.wanem("restore")
        restored_at = time.time()
        self.assertNotIn(during["state"], ("COMPLETED", "FAILED", "CANCELLED"), during)
        self.assertEqual(during["bytes_done"], before["bytes_done"], "nothing can be acknowledged over a cut link")

        resumed_after = None
        deadline = time.time() + 180
        while True:
            s = self.status(tid)
            if resumed_after is None and s["bytes_done"] > during["bytes_done"]:
                resumed_after = time.time() - restored_at
            if s["state"] in ("COMPLETED", "FAILED", "CANCELLED"):
                break
            self.assertLess(time.time(), deadline, f"{s}\n{self.log('site-a')[-3000:]}")
            time.sleep(0.2)
        self.assertEqual(s["state"], "COMPLETED", s.get("error"))
        self.assertEqual(sha256(src), sha256(self.path("site-b", "ckpt", "ckpt.bin")))
        print(f"\nlink cut: {CUT_SECONDS:.0f} s at {before['bytes_done'] / MIB:.0f} MiB; "
              f"progress resumed {resumed_after:.1f} s after the restore; "
              f"done in {time.time() - cut_at:.1f} s after the cut began; "
              f"resent {s['resent_bytes'] / MIB:.1f} MiB; sessions {s.get('attempts')}", flush=True)


if __name__ == "__main__":
    unittest.main()
