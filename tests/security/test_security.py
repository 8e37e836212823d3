"""Hostile input (ctest label `security`): each case is refused with a clear
log line, the daemon keeps serving, and nothing is written. Wrong CA, unknown
site and path traversal are in tests/integration/test_refusals.py (also
labelled security)."""

import datetime
import json
import os
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import lh  # noqa: E402

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

MAGIC = 0x4D46484C
HELLO, CONTROL, CHUNK = 1, 2, 3


def frame(kind, payload, length=None, magic=MAGIC, session=0):
    n = len(payload) if length is None else length
    return struct.pack("<IBBHIIQ", magic, 1, kind, 0, n, 0, session) + payload


def hello(role, transfer_id=""):
    # longhaul.v1.Hello: role=1 (varint), transfer_id=2 (bytes), protocol_version=4.
    tid = transfer_id.encode()
    return bytes([0x08, role, 0x12, len(tid)]) + tid + bytes([0x20, 1])


class SecurityTest(lh.SitesTestCase):

    def site_b_port(self):
        with open(self.sites.path("site-b", "longhauld.yaml")) as f:
            return int([l for l in f if l.startswith("listen:")][0].rsplit(":", 1)[1])

    def tls_as_site_a(self):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.load_verify_locations(self.sites.path("pki", "ca.pem"))
        ctx.load_cert_chain(self.sites.path("pki", "site-a.pem"), self.sites.path("pki", "site-a.key"))
        raw = socket.create_connection(("127.0.0.1", self.site_b_port()), timeout=10)
        return ctx.wrap_socket(raw, server_hostname="site-b")

    def assert_closed_by_peer(self, sock):
        sock.settimeout(10)
        try:
            data = sock.recv(1 << 16)
        except (ConnectionResetError, ssl.SSLError, OSError):
            return
        self.assertEqual(data, b"", "the daemon should have closed the connection")

    def assert_still_serving_and_nothing_written(self):
        export = self.sites.export("site-b")
        self.assertEqual([n for n in os.listdir(export) if n != ".longhaul"], [])
        src = self.sites.path("ok.bin")
        lh.write_random(src, 100000, seed=5)
        proc, result = self.sites.cp(src, "site-b:/ckpt/ok.bin")
        self.assertEqual(proc.returncode, 0, proc.stderr)

    def wait_log(self, site, needle, timeout=10):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if needle in self.sites.log(site):
                return
            time.sleep(0.1)
        self.fail(f"{site} log never said {needle!r}:\n{self.sites.log(site)[-2000:]}")

    def test_plaintext_connection_to_the_tls_port_is_refused(self):
        with socket.create_connection(("127.0.0.1", self.site_b_port()), timeout=10) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            self.assert_closed_by_peer(s)
        self.wait_log("site-b", "not a TLS 1.3 client")
        self.assert_still_serving_and_nothing_written()

    def test_frame_with_bad_magic_is_refused(self):
        with self.tls_as_site_a() as s:
            s.sendall(frame(HELLO, hello(1), magic=0xDEADBEEF))
            self.assert_closed_by_peer(s)
        self.wait_log("site-b", "bad magic")
        self.assert_still_serving_and_nothing_written()

    def test_oversized_frame_is_refused_before_it_is_read(self):
        with self.tls_as_site_a() as s:
            s.sendall(frame(HELLO, b"", length=0xFFFFFFFF))
            self.assert_closed_by_peer(s)
        self.wait_log("site-b", "exceeds the limit")
        self.assert_still_serving_and_nothing_written()

    def test_malformed_protobuf_is_refused(self):
        with self.tls_as_site_a() as s:
            s.sendall(frame(HELLO, b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"))
            self.assert_closed_by_peer(s)
        self.wait_log("site-b", "malformed longhaul.v1.Hello")
        self.assert_still_serving_and_nothing_written()

    def test_data_for_a_transfer_that_was_never_opened_is_refused(self):
        with self.tls_as_site_a() as s:
            s.sendall(frame(HELLO, hello(2, "t-forged")))
            s.sendall(frame(CHUNK, b"\x00" * 64))
            self.assert_closed_by_peer(s)
        self.wait_log("site-b", "is not open here")
        self.assert_still_serving_and_nothing_written()

    def test_expired_certificate_is_refused(self):
        # Signed by the right CA, names a configured site, but expired.
        pki = self.sites.path("pki")
        with open(os.path.join(pki, "ca.key"), "rb") as f:
            ca_key = serialization.load_pem_private_key(f.read(), password=None)
        with open(os.path.join(pki, "ca.pem"), "rb") as f:
            ca_cert = x509.load_pem_x509_certificate(f.read())
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "site-a")]))
                .issuer_name(ca_cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=30))
                .not_valid_after(now - datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([x509.DNSName("site-a")]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        expired = self.sites.path("expired")
        os.makedirs(expired)
        with open(os.path.join(expired, "site-a.pem"), "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        with open(os.path.join(expired, "site-a.key"), "wb") as f:
            f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.load_verify_locations(os.path.join(pki, "ca.pem"))
        ctx.load_cert_chain(os.path.join(expired, "site-a.pem"), os.path.join(expired, "site-a.key"))
        raw = socket.create_connection(("127.0.0.1", self.site_b_port()), timeout=10)
        with ctx.wrap_socket(raw, server_hostname="site-b") as s:
            # TLS 1.3 finishes the client side before the server judges the
            # client certificate; the refusal arrives as an alert or a close.
            try:
                s.sendall(frame(HELLO, hello(3)))
            except (ssl.SSLError, OSError):
                pass
            self.assert_closed_by_peer(s)
        self.wait_log("site-b", "certificate has expired")
        self.assert_still_serving_and_nothing_written()


class TcpControlTokenTest(unittest.TestCase):
    """The TCP control address: every call needs the bearer token."""

    TOKEN = "tok-" + "7f3a9c" * 6

    def setUp(self):
        self.token_dir = tempfile.mkdtemp(prefix="lh-token-")
        self.addCleanup(shutil.rmtree, self.token_dir, True)
        self.token_file = os.path.join(self.token_dir, "control.token")
        self.write_token(self.token_file, self.TOKEN)
        self.sites = lh.Sites(f"control_listen: 127.0.0.1:0\ncontrol_token_file: {self.token_file}\n")
        self.addCleanup(self.sites.cleanup)
        self.sites.up()
        ready = [l for l in self.sites.log("site-a").splitlines() if "control also on tcp" in l]
        self.assertEqual(len(ready), 1, self.sites.log("site-a"))
        self.address = ready[0].split("control also on tcp ")[1].split()[0]

    @staticmethod
    def write_token(path, token):
        with open(path, "w") as f:
            f.write(token + "\n")
        os.chmod(path, 0o600)

    def tcp_cli(self, *args, token_file=None):
        cmd = [os.path.join(lh.BIN, "longhaul"), "--daemon", self.address]
        if token_file:
            cmd += ["--token-file", token_file]
        env = {k: v for k, v in os.environ.items() if k != "LONGHAUL_TOKEN_FILE"}
        return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=120, env=env)

    def assert_nothing_submitted(self):
        listed = json.loads(self.sites.cli("a", "ls", "--all", "--json", check=True).stdout)
        self.assertEqual(listed["transfers"], [])
        export = self.sites.export("site-b")
        self.assertEqual([n for n in os.listdir(export) if n != ".longhaul"], [])

    def test_request_without_a_token_is_refused_and_logged(self):
        src = self.sites.path("f.bin")
        lh.write_random(src, 4096, seed=1)
        for args in (("cp", src, "site-b:/ckpt/f.bin"), ("ls",), ("limit", "--peer", "site-b", "1Mbit")):
            proc = self.tcp_cli(*args)
            self.assertEqual(proc.returncode, 1, proc.stdout)
            self.assertIn("refused: no bearer token", proc.stderr)
        log = self.sites.log("site-a")
        self.assertIn("control call Submit from ipv4:127.0.0.1:", log)
        self.assertIn("refused: no bearer token", log)
        self.assert_nothing_submitted()
        self.assertIn("no rate caps", self.sites.cli("a", "limit", check=True).stdout)

    def test_wrong_token_is_refused(self):
        wrong = os.path.join(self.token_dir, "wrong.token")
        self.write_token(wrong, self.TOKEN[:-1] + "0")
        src = self.sites.path("f.bin")
        lh.write_random(src, 4096, seed=1)
        proc = self.tcp_cli("cp", src, "site-b:/ckpt/f.bin", token_file=wrong)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("refused: a wrong bearer token", proc.stderr)
        self.assertIn("refused: a wrong bearer token", self.sites.log("site-a"))
        self.assert_nothing_submitted()

    def test_right_token_drives_the_daemon(self):
        src = self.sites.path("f.bin")
        lh.write_random(src, 300000, seed=2)
        proc = self.tcp_cli("cp", src, "site-b:/ckpt/f.bin", "--wait", "--json", token_file=self.token_file)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(json.loads(proc.stdout)["state"], "COMPLETED")
        with open(src, "rb") as a, open(os.path.join(self.sites.export("site-b"), "f.bin"), "rb") as b:
            self.assertEqual(a.read(), b.read())


if __name__ == "__main__":
    unittest.main()
