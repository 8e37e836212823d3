"""Revocation (ctest label `security`): `deploy/pki.sh revoke DIR SITE` lists a
site's certificate in the CRL, and a SIGHUP makes a daemon refuse that site's
handshakes and close its open sessions, while other sites carry on."""

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import lh  # noqa: E402
from test_security import HELLO, frame, hello  # noqa: E402

MIB = 1 << 20
ROLE_CONTROL = 1  # longhaul.v1.Hello.CONTROL
CUT_WITHIN = 60  # seconds from the SIGHUP to every session of the revoked site closed


class RevocationTest(lh.SitesTestCase):
    site_names = ("site-a", "site-b", "site-c")
    # A transfer that a revoked site cannot finish ends soon instead of after an hour.
    extra_config = "transfer:\n  give_up_after: 20s\n"

    def port(self, site):
        with open(self.sites.path(site, "longhauld.yaml")) as f:
            return int([l for l in f if l.startswith("listen:")][0].rsplit(":", 1)[1])

    def revoke(self, site):
        proc = subprocess.run([os.path.join(lh.ROOT, "deploy", "pki.sh"), "revoke",
                               self.sites.path("pki"), site],
                              cwd=self.sites.dir, capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertTrue(os.path.exists(self.sites.path("pki", "crl.pem")), proc.stderr)

    def sighup(self, site):
        os.kill(self.sites.pid(site), signal.SIGHUP)

    def wait_log(self, site, *needles, timeout=CUT_WITHIN):
        """Waits for one line of `site`'s log holding every needle; returns it."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            for line in self.sites.log(site).splitlines():
                if all(n in line for n in needles):
                    return line
            time.sleep(0.1)
        self.fail(f"{site} log has no line with {needles}:\n{self.sites.log(site)[-3000:]}")

    def raw_session_as_site_a(self):
        """A TLS connection to site-b with site-a's certificate that opened a
        control session and then holds it open, as a peer that keeps its
        sessions past a revocation would."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.load_verify_locations(self.sites.path("pki", "ca.pem"))
        ctx.load_cert_chain(self.sites.path("pki", "site-a.pem"), self.sites.path("pki", "site-a.key"))
        raw = socket.create_connection(("127.0.0.1", self.port("site-b")), timeout=10)
        s = ctx.wrap_socket(raw, server_hostname="site-b")
        self.addCleanup(s.close)
        s.sendall(frame(HELLO, hello(ROLE_CONTROL, "t-held-open")))
        return s

    def assert_open(self, sock):
        sock.settimeout(1)
        with self.assertRaises(TimeoutError, msg="site-b closed a session of a valid site"):
            sock.recv(1)

    def wait_closed(self, sock, timeout):
        sock.settimeout(timeout)
        try:
            data = sock.recv(1 << 16)
        except TimeoutError:
            self.fail(f"site-b kept a revoked site's session open for {timeout:.0f}s")
        except (ConnectionResetError, ssl.SSLError, OSError):
            return
        self.assertEqual(data, b"", "site-b answered on a revoked site's session")

    def start(self, site, src, dest, *args):
        return self.sites.cli(site, "cp", src, dest, *args, check=True).stdout.strip()

    def wait_sending(self, site, tid):
        lh.wait_until(lambda: self.sites.status(site, tid)["bytes_sent"] >= MIB, 60,
                      f"{tid} to move data", interval=0.1)

    def assert_refused_as_revoked(self, proc):
        """The submit's check with the destination fails on the revoked
        certificate either as the destination's refusal (exit 2, before any
        id) or, when the handshake itself fails there, as a transfer that
        FAILED at its first open (exit 1); either way naming the revocation."""
        out = proc.stdout + proc.stderr
        if proc.returncode == 2:
            self.assertIn("revoked", proc.stderr, out)
            return
        self.assertEqual(proc.returncode, 1, out)
        result = json.loads(proc.stdout)
        self.assertEqual(result["state"], "FAILED", out)
        self.assertIn("revoked", result["error"], out)

    def test_revoked_site_is_cut_off_and_other_sites_keep_working(self):
        small = self.sites.path("small.bin")
        lh.write_random(small, 200_000, seed=1)
        self.sites.cli("a", "cp", small, "site-b:/ckpt/before", "--wait", check=True)

        # Long transfers from site-a (tcp and udp), one from site-c that
        # spans the reload, and a raw session held open by site-a.
        big = self.sites.path("big.bin")
        with open(big, "wb") as f:  # written, not truncated: holes would not be sent
            block = bytes(MIB)
            for _ in range(512):
                f.write(block)
        self.sites.cli("a", "limit", "--peer", "site-b", "40Mbit", check=True)
        long_args = ("--chunk-size", "4MiB", "--streams", "4")
        long_tcp = self.start("a", big, "site-b:/ckpt/long-tcp", "--transport", "tcp", *long_args)
        long_udp = self.start("a", big, "site-b:/ckpt/long-udp", "--transport", "udp", *long_args)
        held = self.raw_session_as_site_a()
        for tid in (long_tcp, long_udp):
            self.wait_sending("a", tid)
        self.assert_open(held)
        from_c = self.sites.path("from-c.bin")
        lh.write_random(from_c, 96 * MIB, seed=2)
        self.sites.cli("c", "limit", "--peer", "site-b", "40Mbit", check=True)
        c_tid = self.start("c", from_c, "site-b:/ckpt/from-c", "--chunk-size", "4MiB")
        self.wait_sending("c", c_tid)

        self.revoke("site-a")
        self.sighup("site-b")
        hup = time.time()
        self.assertEqual(self.sites.status("c", c_tid)["state"], "RUNNING",
                         "site-c's transfer must span the reload; make it larger")
        self.wait_log("site-b", "reloaded TLS trust", "crl.pem")

        # Open sessions of the revoked site end within a minute of the reload.
        self.wait_closed(held, CUT_WITHIN - (time.time() - hup))
        for tid in (long_tcp, long_udp):
            done = self.sites.wait_state("a", tid, {"FAILED", "COMPLETED"},
                                         timeout=CUT_WITHIN - (time.time() - hup))
            self.assertEqual(done["state"], "FAILED", done)
            self.assertIn("revoked", done.get("error", ""), done)
        self.wait_log("site-b", "closing", "site-a", "revoked")
        self.wait_log("site-b", "closing udp flow", "site-a", "revoked")
        self.assertLess(time.time() - hup, CUT_WITHIN)

        # A new transfer from site-a is refused, named in site-b's log.
        self.assert_refused_as_revoked(
            self.sites.cli("a", "cp", small, "site-b:/ckpt/after", "--wait", "--json"))
        line = self.wait_log("site-b", "refused connection", "site-a", "is revoked")
        self.assertIn("crl.pem", line)
        # site-b does not dial site-a either.
        self.assert_refused_as_revoked(
            self.sites.cli("b", "cp", small, "site-a:/ckpt/from-b", "--wait", "--json"))

        export_b = self.sites.export("site-b")
        for name in ("after", "long-tcp", "long-udp"):
            self.assertFalse(os.path.exists(os.path.join(export_b, name)), name)
        self.assertFalse(os.path.exists(os.path.join(self.sites.export("site-a"), "from-b")))

        # site-c's session lived through the reload, and site-c still works both ways.
        done = self.sites.wait_state("c", c_tid, {"FAILED", "COMPLETED"}, timeout=120)
        self.assertEqual(done["state"], "COMPLETED", done)
        self.assertEqual(done["attempts"], 1, done)
        with open(from_c, "rb") as a, open(os.path.join(export_b, "from-c"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        self.sites.cli("c", "cp", small, "site-b:/ckpt/from-c-after", "--wait", check=True)
        self.sites.cli("b", "cp", small, "site-c:/ckpt/from-b", "--wait", check=True)
        self.assertTrue(os.path.exists(os.path.join(self.sites.export("site-c"), "from-b")))

    def test_a_bad_crl_on_reload_keeps_the_old_trust(self):
        with open(self.sites.path("pki", "crl.pem"), "w") as f:
            f.write("-----BEGIN X509 CRL-----\nnot a crl\n-----END X509 CRL-----\n")
        self.sighup("site-b")
        self.wait_log("site-b", "reload", "crl.pem", "kept the previous")
        small = self.sites.path("small.bin")
        lh.write_random(small, 100_000, seed=3)
        self.sites.cli("a", "cp", small, "site-b:/ckpt/still", "--wait", check=True)


if __name__ == "__main__":
    unittest.main()
