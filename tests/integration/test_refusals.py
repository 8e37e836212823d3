"""Bad destinations and bad peers are refused with a clear error, and nothing
is written outside staging."""

import json
import os
import shutil
import subprocess
import time
import unittest

import lh


class DestinationRefusalTest(lh.SitesTestCase):

    def setUp(self):
        super().setUp()
        self.src = self.sites.path("src")
        lh.write_random(os.path.join(self.src, "x.bin"), 4096, seed=1)
        self.outside = self.sites.path("outside")
        os.makedirs(self.outside)

    def refused(self, dest, expect_in_error):
        """The destination's refusal comes before submit returns an id: exit
        2 with what to fix on stderr, no transfer at either site, nothing
        written outside or staged."""
        proc, result = self.sites.cp(self.src, dest, wait=False)
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        self.assertIsNone(result, proc.stdout)
        self.assertIn(expect_in_error, proc.stderr)
        self.assertIn("refuses", proc.stderr)
        for site in ("a", "b"):
            listed = json.loads(self.sites.cli(site, "ls", "--all", "--json", check=True).stdout)
            self.assertEqual(listed["transfers"], [], site)
        self.assertEqual(os.listdir(self.outside), [])
        staging = os.path.join(self.sites.export("site-b"), ".longhaul", "staging")
        self.assertEqual(os.listdir(staging) if os.path.isdir(staging) else [], [])
        return proc

    def test_dotdot_is_refused(self):
        self.refused("site-b:/ckpt/../outside/x", "..")
        self.assertFalse(os.path.exists(self.sites.path("site-b", "outside")))

    def test_absolute_path_is_refused(self):
        self.refused(f"site-b:/ckpt/{self.outside}/x", "absolute")

    def test_symlink_inside_export_pointing_out_is_refused(self):
        os.symlink(self.outside, os.path.join(self.sites.export("site-b"), "link"))
        self.refused("site-b:/ckpt/link/x", "symlink")

    def test_unknown_export_is_refused_and_names_the_known_ones(self):
        self.refused("site-b:/nope/x", "ckpt")

    def test_unknown_peer_site_is_a_usage_error(self):
        proc, _ = self.sites.cp(self.src, "site-z:/ckpt/x")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("unknown peer site 'site-z'", proc.stderr)


class PeerAuthTest(lh.SitesTestCase):
    """A third daemon dials site-b with a certificate it must refuse."""

    def start_impostor(self, site, pki):
        d = self.sites.path("impostor")
        os.makedirs(os.path.join(d, "ckpt"), exist_ok=True)
        with open(os.path.join(self.sites.dir, "site-b", "longhauld.yaml")) as f:
            site_b_port = [l for l in f if l.startswith("listen:")][0].split(":")[-1].strip()
        config = os.path.join(d, "longhauld.yaml")
        with open(config, "w") as f:
            f.write(f"""site: {site}
listen: 127.0.0.1:0
state_dir: {d}/state
control_socket: {d}/control.sock
tls: {{ca: {pki}/ca.pem, cert: {pki}/{site}.pem, key: {pki}/{site}.key}}
exports: [{{name: ckpt, path: {d}/ckpt}}, {{name: local, path: {self.sites.dir}}}]
peers: [{{site: site-b, address: "127.0.0.1:{site_b_port}"}}]
transfer: {{give_up_after: 5s}}
""")
        with open(os.path.join(d, "longhauld.log"), "w") as log:
            proc = subprocess.Popen([os.path.join(lh.BIN, "longhauld"), "--config", config],
                                    stdout=log, stderr=log)
        self.addCleanup(lambda: (proc.kill(), proc.wait()))
        for _ in range(100):
            if os.path.exists(os.path.join(d, "control.sock")):
                break
            time.sleep(0.1)
        return f"unix:{d}/control.sock"

    def copy_from(self, daemon):
        src = self.sites.path("src.bin")
        lh.write_random(src, 4096, seed=1)
        proc = subprocess.run([os.path.join(lh.BIN, "longhaul"), "--daemon", daemon, "cp", src,
                               "site-b:/ckpt/stolen", "--wait", "--json"],
                              capture_output=True, text=True, timeout=120)
        return proc, json.loads(proc.stdout)

    def assert_nothing_written(self):
        export = self.sites.export("site-b")
        self.assertEqual([n for n in os.listdir(export) if n != ".longhaul"], [])
        staging = os.path.join(export, ".longhaul", "staging")
        self.assertEqual(os.listdir(staging) if os.path.isdir(staging) else [], [])

    def test_certificate_from_another_ca_is_refused(self):
        other_pki = self.sites.path("other-pki")
        subprocess.run([os.path.join(lh.ROOT, "deploy/pki.sh"), other_pki, "site-a"], check=True)
        daemon = self.start_impostor("site-a", other_pki)
        proc, result = self.copy_from(daemon)
        self.assertEqual(proc.returncode, 1)
        self.assertEqual(result["state"], "FAILED")
        self.assertIn("certificate", result["error"])
        self.assertIn("refused connection", self.sites.log("site-b"))
        self.assert_nothing_written()

    def test_certificate_for_an_unconfigured_site_is_refused(self):
        pki = self.sites.path("pki")
        subprocess.run([os.path.join(lh.ROOT, "deploy/pki.sh"), pki, "site-c"], check=True)
        daemon = self.start_impostor("site-c", pki)
        proc, result = self.copy_from(daemon)
        self.assertEqual(proc.returncode, 1)
        self.assertEqual(result["state"], "FAILED")
        self.assertIn("names no configured peer site", self.sites.log("site-b"))
        self.assert_nothing_written()


if __name__ == "__main__":
    unittest.main()
