"""Shared memory a local exchange client cannot pull away (ctest label
`security`).

An exchange client lends the daemon a shared-memory segment for each call.
A client that truncates its segment while a Recv is posted used to make the
daemon die of SIGBUS when the data arrived. Here a client tries exactly
that, and raw clients of the segment socket offer segments that could be
shrunk; the daemon stays up, refuses what it cannot trust with an error that
says why, and the next exchange and a checkpoint transfer started meanwhile
both complete."""

import errno
import fcntl
import glob
import json
import os
import socket
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import lh  # noqa: E402

sys.path.insert(0, os.path.join(lh.BIN, "..", "python"))
import longhaul  # noqa: E402

MIB = 1 << 20
MESSAGE = 8 * MIB



def own_segments():
    """Paths through which this process's exchange segments can be opened:
    its mapped memfds (through /proc/self/map_files, as root), or its
    /dev/shm segments."""
    paths = []
    with open("/proc/self/maps") as f:
        for line in f:
            if "/memfd:longhaul" in line:
                paths.append("/proc/self/map_files/" + line.split()[0])
    return paths + glob.glob(f"/dev/shm/longhaul-{os.getpid()}-*")


def register(socket_path, fd):
    """Offers `fd` on the daemon's segment socket; returns its one-line answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(socket_path)
        if fd is None:
            s.sendall(b"S")
        else:
            socket.send_fds(s, [b"S"], [fd])
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = s.recv(1024)
            if not chunk:
                break
            answer += chunk
        return answer.decode()


class ShmAbuseTest(unittest.TestCase):
    def setUp(self):
        self.sites = lh.Sites()
        self.addCleanup(self.sites.cleanup)
        self.sites.up()
        self.pid = self.sites.pid("site-a")
        self.groups = self.join("shm-abuse")

    def join(self, name):
        groups = {}

        def run(site):
            groups[site] = longhaul.ExchangeGroup(
                self.sites.env["LONGHAUL_SITE_" + site[-1].upper()], name,
                ["site-a", "site-b"], timeout=30.0)

        threads = [threading.Thread(target=run, args=(s,)) for s in ("site-a", "site-b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(sorted(groups), ["site-a", "site-b"], "both sites joined")
        for g in groups.values():
            self.addCleanup(g.close)
        return groups

    def start_transfer(self):
        src = self.sites.path("src")
        os.makedirs(src)
        for i in range(3):
            lh.write_random(os.path.join(src, f"shard_{i}.bin"), 8 * MIB, seed=i)
        proc, result = self.sites.cp(src, "site-b:/ckpt/during-abuse", wait=False)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return result["id"]

    def assert_transfer_verifies(self, transfer_id):
        self.sites.wait_state("a", transfer_id, ("COMPLETED",), timeout=120)
        proc = self.sites.cli("a", "verify", transfer_id, "--json")
        self.assertEqual(proc.returncode, 0, proc.stderr + proc.stdout)
        self.assertTrue(json.loads(proc.stdout)["ok"], proc.stdout)

    def assert_good_exchange(self, tag):
        ga, gb = self.groups["site-a"], self.groups["site-b"]
        payload = os.urandom(MIB)
        out = bytearray(MIB)
        sender = threading.Thread(target=gb.send, args=("site-a", tag, payload))
        sender.start()
        n = ga.recv("site-b", tag, out, timeout=60)
        sender.join(60)
        self.assertEqual(n, MIB)
        self.assertEqual(bytes(out), payload)

    def test_truncating_a_posted_recv_segment_leaves_the_daemon_serving(self):
        ga, gb = self.groups["site-a"], self.groups["site-b"]
        out = bytearray(MESSAGE)
        result = {}

        def receive():
            try:
                result["bytes"] = ga.recv("site-b", "victim", out, timeout=60)
            except longhaul.Error as e:
                result["error"] = str(e)

        receiver = threading.Thread(target=receive)
        receiver.start()
        segments = []
        lh.wait_until(lambda: segments.extend(own_segments()) or segments, 30,
                      "the Recv's segment to exist")
        # The daemon maps the segment when the call reaches it; the Recv
        # waits for its data from then on, so a fixed grace is no assertion.
        receiver.join(1.0)
        # Cut the segment down to its first page: the progress word the
        # client polls stays, the buffer the daemon writes into goes.
        truncated = []
        for path in segments:
            fd = os.open(path, os.O_RDWR)
            try:
                os.ftruncate(fd, 4096)
                truncated.append(path)
            except OSError as e:
                self.assertEqual(e.errno, errno.EPERM, f"truncating {path}: {e}")  # sealed
            finally:
                os.close(fd)
        transfer_id = self.start_transfer()
        payload = os.urandom(MESSAGE)
        try:
            gb.send("site-a", "victim", payload, timeout=60)
        except longhaul.Error as e:
            result["send_error"] = str(e)
        receiver.join(90)
        self.assertFalse(receiver.is_alive(), "the Recv returned")
        self.assertTrue(lh.process_alive(self.pid),
                        "site-a's daemon died:\n" + self.sites.log("site-a")[-2000:])
        if truncated:
            self.assertIn("error", result, f"a Recv into truncated {truncated} succeeded")
        else:
            self.assertNotIn("send_error", result)
            self.assertEqual(result.get("bytes"), MESSAGE, result)
            self.assertEqual(bytes(out), payload)
        self.assert_good_exchange("after-truncate")
        self.assert_transfer_verifies(transfer_id)
        self.assertTrue(lh.process_alive(self.pid))

    def test_daemon_refuses_segments_the_client_could_shrink(self):
        transfer_id = self.start_transfer()
        socket_path = self.sites.path("site-a", "control.sock.shm")
        self.assertTrue(os.path.exists(socket_path), "site-a serves a segment socket")
        unsealed = os.memfd_create("longhaul-hostile", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self.addCleanup(os.close, unsealed)
        os.ftruncate(unsealed, 4 * MIB)
        answer = register(socket_path, unsealed)
        self.assertTrue(answer.startswith("error "), answer)
        self.assertIn("F_SEAL_SHRINK", answer)

        # Sealed against growing only: still shrinkable.
        fcntl.fcntl(unsealed, fcntl.F_ADD_SEALS, fcntl.F_SEAL_GROW)
        answer = register(socket_path, unsealed)
        self.assertTrue(answer.startswith("error "), answer)
        self.assertIn("F_SEAL_SHRINK", answer)

        # Not a memfd at all: a regular file (on tmpfs, refused for its seals).
        path = self.sites.path("regular")
        with open(path, "wb") as f:
            f.truncate(4 * MIB)
        fd = os.open(path, os.O_RDWR)
        self.addCleanup(os.close, fd)
        answer = register(socket_path, fd)
        self.assertTrue(answer.startswith("error "), answer)
        self.assertIn("memfd", answer)

        # No fd.
        answer = register(socket_path, None)
        self.assertTrue(answer.startswith("error "), answer)

        # A properly sealed one is taken.
        sealed = os.memfd_create("longhaul-good", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self.addCleanup(os.close, sealed)
        os.ftruncate(sealed, 4 * MIB)
        fcntl.fcntl(sealed, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        answer = register(socket_path, sealed)
        self.assertRegex(answer, r"^ok [0-9a-f]{32}\n$")

        self.assertTrue(lh.process_alive(self.pid))
        self.assert_good_exchange("after-refusals")
        self.assert_transfer_verifies(transfer_id)


if __name__ == "__main__":
    unittest.main()
