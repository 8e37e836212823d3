"""Memory that grows only with bytes received (ctest label `security`): a peer
with a valid certificate (site-c, hostile_peer.py) declares huge payloads and
sends little, opens a transfer with a chunk size past the receiver's maximum,
and holds 8 data streams in the middle of maximal chunks. site-b stays alive,
its resident memory stays within peer_limits.memory_per_peer plus a margin
(and, under a 2 GiB cgroup limit, it is not OOM-killed), and a real transfer
from site-a that runs meanwhile completes and verifies."""

import json
import os
import ssl
import sys
import threading
import time
import unittest
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import lh  # noqa: E402

import hostile_peer  # noqa: E402

MIB = 1 << 20
MEMORY_PER_PEER = 256 * MIB
MAX_CHUNK = 64 * MIB
PIECE = 4 * MIB  # Receiver::kDurablePiece: what one receiving stream holds
# What the daemon may hold beyond the hostile peer's budget: the real
# transfer's buffers (8 streams of 1 MiB chunks), TLS and allocator slack.
MARGIN = 64 * MIB
CGROUP_ROOT = "/sys/fs/cgroup/memory"



class MemoryAbuseTest(unittest.TestCase):
    def setUp(self):
        self.sites = lh.Sites(
            f"peer_limits:\n  memory_per_peer: {MEMORY_PER_PEER // MIB}MiB\n"
            f"transfer:\n  max_chunk_size: {MAX_CHUNK // MIB}MiB\n",
            names=("site-a", "site-b", "site-c"))
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

    # -- helpers ----------------------------------------------------------

    def hostile(self):
        with open(self.sites.path("site-b", "longhauld.yaml")) as f:
            listen = [l for l in f if l.startswith("listen:")][0].split()[1]
        return hostile_peer.HostilePeer(self.sites.path("pki"), "site-c", listen, "site-b")

    def rss(self):
        return lh.proc_status(self.sites.pid("site-b"), "VmRSS") * 1024

    def assert_alive(self):
        self.assertTrue(lh.process_alive(self.sites.pid("site-b")),
                        f"site-b died:\n{self.sites.log('site-b')[-3000:]}")

    def wait_log(self, needle, count=1, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.sites.log("site-b").count(needle) >= count:
                return
            time.sleep(0.1)
        self.fail(f"site-b's log never said {needle!r} {count} times:\n"
                  f"{self.sites.log('site-b')[-3000:]}")

    def settle(self, needle, count, timeout=30):
        """Waits until site-b's log says `needle` `count` times (the abuse was
        handled) or site-b is gone, so that what follows checks the daemon
        after the abuse reached it."""
        pid = self.sites.pid("site-b")
        deadline = time.time() + timeout
        while time.time() < deadline and self.sites.log("site-b").count(needle) < count:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                        return
            except FileNotFoundError:
                return
            time.sleep(0.1)

    def start_transfer(self, name, size=24 * MIB):
        """Starts a site-a -> site-b copy in the background; returns a function
        that waits for it and checks that it completed and verifies."""
        src = self.sites.path(f"{name}.bin")
        lh.write_random(src, size, seed=len(name))
        outcome = {}

        def run():
            outcome["cp"] = self.sites.cp(src, f"site-b:/ckpt/{name}.bin", "--chunk-size", "1MiB")

        thread = threading.Thread(target=run, daemon=True)
        thread.start()

        def finish():
            thread.join(timeout=240)
            self.assertFalse(thread.is_alive(), "the real transfer did not end")
            proc, result = outcome["cp"]
            self.assertEqual((proc.returncode, (result or {}).get("state")), (0, "COMPLETED"),
                             proc.stderr + proc.stdout)
            verify = self.sites.cli("a", "verify", result["id"], "--json")
            self.assertEqual(verify.returncode, 0, verify.stdout + verify.stderr)
            self.assertTrue(json.loads(verify.stdout)["ok"], verify.stdout)
        return finish

    def flood_headers(self, count, declared=255 * MIB):
        """`count` HELLO headers and `count` CONTROL headers (after a valid
        HELLO) declaring `declared` bytes each, then nothing."""
        peer = self.hostile()
        for _ in range(count):
            s = peer.tls()
            self.sockets.append(s)
            s.sendall(hostile_peer.frame_header(hostile_peer.HELLO, declared))
        for i in range(count):
            channel = peer.control(f"flood-{i}")
            self.sockets.append(channel.sock)
            channel.sock.sendall(
                hostile_peer.frame_header(hostile_peer.CONTROL, declared, channel.session))

    # -- tests ------------------------------------------------------------

    def test_headers_declaring_huge_payloads_hold_no_memory(self):
        baseline = self.rss()
        self.flood_headers(8)
        finish = self.start_transfer("during-flood")
        refused = "HELLO frame payload of 267386880 bytes exceeds the limit of 16384"
        self.settle(refused, 8)
        self.assert_alive()
        grown = self.rss() - baseline
        self.assertLess(grown, MARGIN, f"RSS grew by {grown / MIB:.0f} MiB")
        finish()
        self.assert_alive()
        grown = self.rss() - baseline
        self.assertLess(grown, MARGIN, f"RSS grew by {grown / MIB:.0f} MiB")
        # Every HELLO was refused by its ceiling and closed, without its payload.
        self.wait_log(refused, count=8)
        for s in self.sockets[:8]:
            s.settimeout(10)
            try:
                got = s.recv(1)
            except (ssl.SSLError, ConnectionError):
                got = b""
            self.assertEqual(got, b"", "the daemon kept a refused HELLO's connection open")

    @unittest.skipUnless(os.access(CGROUP_ROOT, os.W_OK),
                         f"needs the cgroup v1 memory controller at {CGROUP_ROOT}, as root")
    def test_a_header_flood_under_a_2_gib_cgroup_limit_is_not_oom_killed(self):
        cgroup = os.path.join(CGROUP_ROOT, f"longhaul-abuse-{uuid.uuid4().hex[:12]}")
        os.mkdir(cgroup)
        self.addCleanup(self.remove_cgroup, cgroup)
        with open(os.path.join(cgroup, "memory.limit_in_bytes"), "w") as f:
            f.write(str(2 << 30))
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(self.sites.pid("site-b")))
        self.flood_headers(12)
        finish = self.start_transfer("under-cgroup")
        self.settle("exceeds the limit of 16384", 12)
        self.assert_alive()
        with open(os.path.join(cgroup, "memory.oom_control")) as f:
            oom = dict(line.split() for line in f)
        self.assertEqual(oom.get("oom_kill", "0"), "0", oom)
        finish()
        self.assert_alive()
        # Page cache of the transfer's writes counts here too.
        with open(os.path.join(cgroup, "memory.max_usage_in_bytes")) as f:
            peak = int(f.read())
        self.assertLess(peak, 1 << 30, f"the cgroup peaked at {peak / MIB:.0f} MiB")
        self.wait_log("exceeds the limit of 16384", count=12)

    def remove_cgroup(self, cgroup):
        try:
            with open(os.path.join(cgroup, "cgroup.procs")) as f:
                pids = f.read().split()
            for pid in pids:
                try:
                    with open(os.path.join(CGROUP_ROOT, "cgroup.procs"), "w") as f:
                        f.write(pid)
                except OSError:
                    pass
        except OSError:
            pass
        for _ in range(50):
            try:
                os.rmdir(cgroup)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
        os.rmdir(cgroup)

    def test_chunk_sizes_past_the_maximum_are_refused_and_partial_chunks_stay_in_budget(self):
        peer = self.hostile()
        control = peer.control("too-big")
        self.sockets.append(control.sock)
        files = [hostile_peer.manifest_file("shard.bin", 8 * MAX_CHUNK)]
        refused = control.open("too-big", "ckpt", "too-big",
                               hostile_peer.manifest(files, chunk_size=256 * MIB))
        self.assertFalse(refused.ok(), "a 256 MiB chunk size was accepted")
        self.assertIn("chunk size 268435456", refused.error)
        self.assertIn(str(MAX_CHUNK), refused.error)

        control = peer.control("partial")
        self.sockets.append(control.sock)
        opened = control.open("partial", "ckpt", "partial",
                              hostile_peer.manifest(files, chunk_size=MAX_CHUNK))
        self.assertTrue(opened.ok(), opened.error)
        baseline = self.rss()
        # Each stream holds one piece of its chunk: the budget covers this
        # many, and the streams past them are told the limit.
        held = MEMORY_PER_PEER // PIECE
        told = 8
        sent = 3 * MIB
        senders = []
        for i in range(held + told):
            data = peer.connect(hostile_peer.ROLE_DATA, "partial")
            self.sockets.append(data.sock)
            head = (hostile_peer.frame_header(hostile_peer.CHUNK, 32 + MAX_CHUNK, data.session) +
                    hostile_peer.chunk_header(0, i % 8))

            def send(sock=data.sock, head=head):
                try:
                    sock.sendall(head + bytes(sent))
                except OSError:
                    pass
            t = threading.Thread(target=send, daemon=True)
            t.start()
            senders.append(t)
        finish = self.start_transfer("during-partial-chunks")
        for t in senders:
            t.join(timeout=120)
        self.assert_alive()
        grown = self.rss() - baseline
        self.assertLess(grown, MEMORY_PER_PEER + MARGIN, f"RSS grew by {grown / MIB:.0f} MiB")
        finish()
        self.assert_alive()
        grown = self.rss() - baseline
        self.assertLess(grown, MEMORY_PER_PEER + MARGIN, f"RSS grew by {grown / MIB:.0f} MiB")
        self.wait_log("peer_limits.memory_per_peer", count=told)


if __name__ == "__main__":
    unittest.main()
