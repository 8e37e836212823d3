"""Connection abuse against a real daemon (ctest label `security`): idle
plain TCP connections under a task limit, a flood of handshakes from one
address, a TLS peer that never sends HELLO, a slowloris TLS handshake, and
/metrics connections that hold partial headers. Each time the daemon stays
alive with a bounded thread count and RSS, and a real transfer made during
the abuse completes and verifies."""

import json
import os
import resource
import socket
import ssl
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import lh  # noqa: E402

import hostile_peer  # noqa: E402

MIB = 1 << 20
# Attackers dial from another loopback address than the real peer (which
# connects from 127.0.0.1), so the per-address caps they hit are their own.
ATTACKER = "127.0.0.2"
PIDS_ROOT = "/sys/fs/cgroup/pids"
RSS_LIMIT_KIB = 512 * 1024


def client_hello():
    """The bytes of a real TLS 1.3 ClientHello, for partial sends."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="site-b")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()




class AbuseTestCase(unittest.TestCase):
    extra_config = ""

    def setUp(self):
        self.sites = lh.Sites(self.extra_config)
        self.addCleanup(self.sites.cleanup)
        self.sites.up()
        self.sockets = []
        self.addCleanup(self.close_sockets)

    def close_sockets(self):
        for s in self.sockets:
            try:
                s.close()
            except OSError:
                pass
        self.sockets = []

    def listen_port(self, site):
        with open(self.sites.path(site, "longhauld.yaml")) as f:
            listen = [l for l in f if l.startswith("listen:")][0].split()[1]
        return int(listen.rsplit(":", 1)[1])

    def attacker_socket(self, port):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sockets.append(s)
        s.settimeout(10)
        s.bind((ATTACKER, 0))
        s.connect(("127.0.0.1", port))
        return s

    def start_transfer(self, name, size=16 * MIB):
        """Starts `longhaul cp` of a fresh tree to site-b in a thread;
        returns a function that waits for it and checks it verifies."""
        src = self.sites.path("src-" + name)
        lh.write_random(os.path.join(src, "a.bin"), size, seed=1)
        lh.write_random(os.path.join(src, "b.bin"), size // 3, seed=2)
        out = {}

        def run():
            out["cp"] = self.sites.cp(src, f"site-b:/ckpt/{name}", "--chunk-size", "1MiB",
                                      "--streams", "4", timeout=180)

        worker = threading.Thread(target=run, daemon=True)
        worker.start()

        def finish():
            worker.join(200)
            self.assertFalse(worker.is_alive(), "the transfer did not finish")
            proc, result = out["cp"]
            self.assertEqual(proc.returncode, 0, proc.stderr + proc.stdout)
            self.assertEqual(result["state"], "COMPLETED", result)
            dest = os.path.join(self.sites.export("site-b"), name)
            self.assertEqual(lh.tree_digest(src), lh.tree_digest(dest))
            verify = self.sites.cli("a", "verify", result["id"], "--json")
            self.assertEqual(verify.returncode, 0, verify.stdout + verify.stderr)
            self.assertTrue(json.loads(verify.stdout)["ok"])

        return finish

    def assert_bounded(self, pid, max_threads=100):
        self.assertTrue(lh.process_alive(pid), "site-b died:\n" + self.sites.log("site-b")[-3000:])
        self.assertLess(lh.proc_status(pid, "Threads"), max_threads)
        self.assertLess(lh.proc_status(pid, "VmRSS"), RSS_LIMIT_KIB)


class PidsLimitTest(AbuseTestCase):
    """80 idle plain-TCP connections to a daemon whose cgroup allows 64
    tasks: no thread is spent on a connection that has not authenticated."""

    def setUp(self):
        if not os.path.isdir(PIDS_ROOT) or os.geteuid() != 0:
            self.skipTest("needs root and the cgroup v1 pids controller")
        super().setUp()
        self.cgroup = os.path.join(PIDS_ROOT, f"longhaul-abuse-{os.getpid()}-{time.time_ns()}")
        os.mkdir(self.cgroup)
        # Runs after sites.cleanup (cleanups run last-in first-out): the
        # daemon is gone, or is moved back to the root group, then rmdir.
        self.addCleanup(self.remove_cgroup)
        self.addCleanup(self.sites.cleanup)
        with open(os.path.join(self.cgroup, "pids.max"), "w") as f:
            f.write("64")
        with open(os.path.join(self.cgroup, "cgroup.procs"), "w") as f:
            f.write(str(self.sites.pid("site-b")))

    def remove_cgroup(self):
        try:
            with open(os.path.join(self.cgroup, "cgroup.procs")) as f:
                left = f.read().split()
            for pid in left:
                with open(os.path.join(PIDS_ROOT, "cgroup.procs"), "w") as f:
                    f.write(pid)
        except OSError:
            pass
        for _ in range(50):
            try:
                os.rmdir(self.cgroup)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
        os.rmdir(self.cgroup)

    def test_idle_tcp_connections_under_a_task_limit(self):
        pid = self.sites.pid("site-b")
        port = self.listen_port("site-b")
        before = lh.proc_status(pid, "Threads")
        self.assertLess(before, 40, "the daemon starts too many threads for this test")
        for _ in range(80):
            self.attacker_socket(port)
        time.sleep(1)
        self.assert_bounded(pid, max_threads=64)
        finish = self.start_transfer("under-pids-max")
        finish()
        self.assert_bounded(pid, max_threads=64)
        self.assertGreater(self.sites.metric("site-b", "longhaul_peer_handshakes_refused_total",
                                       {"reason": "too_many_from_address"}), 0)


class HandshakeFloodTest(AbuseTestCase):

    def test_200_concurrent_handshakes_from_one_address(self):
        pid = self.sites.pid("site-b")
        port = self.listen_port("site-b")
        hello = client_hello()
        for i in range(200):
            try:
                s = self.attacker_socket(port)
                if i % 2:
                    s.send(hello[:len(hello) // 2])
            except OSError:
                pass  # refused at once: what the caps are for
        finish = self.start_transfer("during-flood")
        self.assert_bounded(pid)
        finish()
        self.assert_bounded(pid)
        self.assertGreater(self.sites.metric("site-b", "longhaul_peer_handshakes_refused_total",
                                       {"reason": "too_many_from_address"}), 0)


class DescriptorExhaustionTest(AbuseTestCase):
    """Pending handshakes from several addresses use up the daemon's
    descriptors: accept fails with EMFILE, the connection is refused and
    counted, the daemon lives and serves once they are gone."""

    def test_running_out_of_descriptors_refuses_connections_only(self):
        pid = self.sites.pid("site-b")
        port = self.listen_port("site-b")
        before = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        self.addCleanup(resource.prlimit, pid, resource.RLIMIT_NOFILE, before)
        in_use = len(os.listdir(f"/proc/{pid}/fd"))
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (in_use + 24, before[1]))
        for host in range(2, 8):  # 6 addresses x 16 pending each > 24 descriptors
            for _ in range(16):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                self.sockets.append(s)
                s.bind((f"127.0.0.{host}", 0))
                s.connect(("127.0.0.1", port))
        lh.wait_until(lambda: "cannot accept" in self.sites.log("site-b"), 10,
                      "an accept failing for lack of descriptors", interval=0.1)
        self.assertTrue(lh.process_alive(pid))
        self.close_sockets()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, before)
        finish = self.start_transfer("after-emfile")
        finish()
        self.assert_bounded(pid)
        self.assertGreater(self.sites.metric("site-b", "longhaul_peer_handshakes_refused_total",
                                       {"reason": "no_descriptor"}), 0)


class HandshakeDeadlineTest(AbuseTestCase):
    extra_config = "peer_limits:\n  handshake_timeout: 2s\n"

    def assert_closed(self, sock, within):
        """recv sees EOF (or a reset) before `within` seconds pass."""
        sock.settimeout(within)
        try:
            while True:
                if not sock.recv(4096):
                    return
        except (ConnectionResetError, ssl.SSLError, BrokenPipeError):
            return
        except socket.timeout:
            self.fail(f"the daemon kept the connection open past {within}s")

    def test_tls_peer_that_never_sends_hello_is_closed(self):
        pid = self.sites.pid("site-b")
        peer = hostile_peer.HostilePeer(self.sites.path("pki"), "site-a",
                                        f"127.0.0.1:{self.listen_port('site-b')}", "site-b")
        sock = peer.tls()
        self.sockets.append(sock)
        self.assert_closed(sock, within=8)
        self.assertTrue(lh.process_alive(pid))
        self.assertGreater(self.sites.metric("site-b", "longhaul_peer_handshakes_timed_out_total"), 0)

    def test_slowloris_handshake_is_closed_and_does_not_stop_a_transfer(self):
        pid = self.sites.pid("site-b")
        port = self.listen_port("site-b")
        hello = client_hello()
        sock = self.attacker_socket(port)
        finish = self.start_transfer("beside-slowloris")
        sent = 0
        closed = False
        try:
            while sent < len(hello):
                sock.send(hello[sent:sent + 1])
                sent += 1
                time.sleep(1)
                try:
                    sock.setblocking(False)
                    if sock.recv(1) == b"":
                        closed = True
                        break
                except BlockingIOError:
                    pass
                finally:
                    sock.setblocking(True)
                if sent >= 8:
                    break
        except (ConnectionResetError, BrokenPipeError):
            closed = True
        self.assertTrue(closed, f"still open after {sent} bytes at 1 byte/s (deadline 2s)")
        finish()
        self.assert_bounded(pid)


class MetricsServerTest(AbuseTestCase):

    def test_partial_headers_do_not_lock_out_a_scrape(self):
        pid = self.sites.pid("site-b")
        port = self.sites.metrics_port("site-b")
        for _ in range(64):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            self.sockets.append(s)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n")
        time.sleep(0.5)
        text = self.sites.scrape("site-b", timeout=30)
        self.assertIn("longhaul_", text)
        self.assertTrue(lh.process_alive(pid))


if __name__ == "__main__":
    unittest.main()
