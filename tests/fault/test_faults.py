"""Fault injection (ctest label `fault`): kills at seeded moments, a full disk,
a corrupted staged chunk, a corrupted byte on the wire, a restart with a long
queue. Seeded by LONGHAUL_FAULT_SEED so a failure can be replayed."""

import errno
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import lh  # noqa: E402

MIB = 1 << 20
SEED = int(os.environ.get("LONGHAUL_FAULT_SEED", "1"))


def make_checkpoint(root, shards=4, shard_size=24 * MIB, seed=0):
    for i in range(shards):
        lh.write_random(os.path.join(root, f"__{i}_0.distcp"), shard_size, seed=seed + i)
    lh.write_random(os.path.join(root, "extra/rng.bin"), 4096, seed=seed + 100)
    lh.write_random(os.path.join(root, ".metadata"), 8192, seed=seed + 101)
    return lh.tree_digest(root)


class KillTest(lh.SitesTestCase):

    def test_sigkill_at_20_seeded_moments_never_publishes_partial(self):
        rng = random.Random(SEED)
        src = self.sites.path("src")
        expected = make_checkpoint(src)
        rows = []
        for i in range(20):
            victim = rng.choice(["site-a", "site-b"])
            delay = rng.uniform(0.0, 0.8)
            tid = self.sites.cli("a", "cp", src, f"site-b:/ckpt/run{i}", "--chunk-size", "4MiB",
                                 "--streams", "4", check=True).stdout.strip()
            time.sleep(delay)
            self.sites.kill(victim)
            dest = os.path.join(self.sites.export("site-b"), f"run{i}")
            if os.path.exists(dest):  # published before the kill: must be whole
                self.assertEqual(lh.tree_digest(dest), expected, f"partial tree after kill {i}")
            restarted = time.time()
            self.sites.up()
            done = self.sites.wait_state("a", tid, {"COMPLETED", "FAILED"})
            self.assertEqual(done["state"], "COMPLETED", done.get("error"))
            self.assertEqual(lh.tree_digest(dest), expected, f"run {i}")
            # At most what was unacknowledged: 2 x streams x chunk size.
            self.assertLessEqual(done["resent_bytes"], 2 * 4 * 4 * MIB,
                                 f"kill {i} of {victim} after {delay:.3f} s: {done}\n"
                                 + "".join(self.sites.log("site-a").splitlines(True)[-40:])
                                 + "".join(self.sites.log("site-b").splitlines(True)[-60:]))
            rows.append((i, victim, round(delay, 3), done["resent_bytes"],
                         round(time.time() - restarted, 2)))
        print("\nkill  victim  after_s  resent_bytes  resume_to_done_s")
        for row in rows:
            print("%4d  %-6s  %7.3f  %12d  %16.2f" % row)


class FullDiskTest(unittest.TestCase):
    """site-b's export is a small tmpfs: the transfer waits, says why, and
    finishes once space is freed, without losing anything."""

    def setUp(self):
        self.sites = lh.Sites()
        self.addCleanup(self.sites.cleanup)
        export = self.sites.export("site-b")
        os.makedirs(export)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", export], check=True)
        self.addCleanup(lambda: subprocess.run(["umount", "-l", export]))
        self.sites.up()

    def test_full_disk_pauses_with_a_clear_error_and_resumes_when_space_is_freed(self):
        src = self.sites.path("src")
        expected = make_checkpoint(src, shards=2, shard_size=40 * MIB)
        tid = self.sites.cli("a", "cp", src, "site-b:/ckpt/step", "--chunk-size", "4MiB",
                             check=True).stdout.strip()
        deadline = time.time() + 60
        status = None
        while time.time() < deadline:
            status = self.sites.status("a", tid)
            if "No space left" in status.get("error", ""):
                break
            time.sleep(0.2)
        self.assertIn("No space left", status.get("error", ""), status)
        self.assertEqual(status["state"], "RUNNING")  # waiting, not failed
        self.assertFalse(os.path.exists(os.path.join(self.sites.export("site-b"), "step")))
        subprocess.run(["mount", "-o", "remount,size=512m", self.sites.export("site-b")], check=True)
        done = self.sites.wait_state("a", tid, {"COMPLETED", "FAILED"}, timeout=120)
        self.assertEqual(done["state"], "COMPLETED", done.get("error"))
        self.assertEqual(lh.tree_digest(os.path.join(self.sites.export("site-b"), "step")), expected)


class CancelRemovesStagingTest(unittest.TestCase):
    """A cancel removes the destination's staging, also when the destination's
    file system (export and state on one disk, a small tmpfs here) is full:
    the open that created the staging could not journal its transfer, and the
    abort could not journal its tombstone. It stays removed across restarts,
    and a cancel that could not reach the destination is sent again."""

    def setUp(self):
        self.sites = lh.Sites()
        self.disk = self.sites.path("site-b")
        os.makedirs(self.disk)
        self.addCleanup(self.cleanup)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", self.disk], check=True)
        self.filler = os.path.join(self.disk, "filler")
        self.sites.up()
        # Inside site-a's export, so that site-b may pull it too.
        self.src = os.path.join(self.sites.export("site-a"), "src")
        make_checkpoint(self.src, shards=2, shard_size=8 * MIB)

    def cleanup(self):
        self.sites.down()
        if os.path.ismount(self.disk) and subprocess.run(["umount", self.disk]).returncode != 0:
            subprocess.run(["umount", "-l", self.disk])
        shutil.rmtree(self.sites.dir, ignore_errors=True)

    def fill(self):
        """Writes the filler until site-b's disk has no byte left."""
        with open(self.filler, "wb", buffering=0) as f:
            for block in (MIB, 64 << 10, 4096, 512, 1):
                try:
                    while True:
                        f.write(b"\xff" * block)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise

    def staging(self, tid):
        return os.path.join(self.sites.export("site-b"), ".longhaul", "staging", tid)

    def wait_refused_for_space(self, tid):
        """Until the source reports that site-b has no space for it."""
        status = {}

        def refused():
            nonlocal status
            status = self.sites.status("a", tid)
            return "No space left" in status.get("error", "")

        lh.wait_until(refused, 60, "site-b refusing the transfer for lack of space", interval=0.2)
        self.assertEqual(status["state"], "RUNNING", status)

    def cancel(self, site, tid):
        proc = self.sites.cli(site, "cancel", tid, "--json", check=True)
        self.assertEqual(json.loads(proc.stdout)["state"], "CANCELLED", proc.stdout)

    def assert_staging_removed_for_good(self, tid):
        lh.wait_until(lambda: not os.path.exists(self.staging(tid)), 30,
                      f"the staging of {tid} removed at site-b", interval=0.1)
        if os.path.exists(self.filler):
            os.unlink(self.filler)  # the operator frees space and restarts site-b
        self.sites.kill("site-b")
        self.sites.up()
        self.sites.cli("b", "ls", check=True)  # serving again
        self.assertFalse(os.path.exists(self.staging(tid)))
        self.assertEqual(self.sites.status("a", tid)["state"], "CANCELLED")

    def test_push_cancelled_while_the_destination_disk_is_full_leaves_no_staging(self):
        self.fill()
        tid = self.sites.cli("a", "cp", self.src, "site-b:/ckpt/step", "--chunk-size", "4MiB",
                             check=True).stdout.strip()
        self.wait_refused_for_space(tid)
        self.cancel("a", tid)
        self.assert_staging_removed_for_good(tid)

    def test_pull_cancelled_while_the_destination_disk_is_full_leaves_no_staging(self):
        # Many files: the pull's manifest is far larger than its request.
        src = os.path.join(self.sites.export("site-a"), "many")
        for i in range(400):
            lh.write_random(os.path.join(src, f"part-{i:04d}.bin"), 1024, seed=i)
        # Full but for a page or two: site-b journals the pull it asks for,
        # but not the manifest site-a then opens it with.
        self.fill()
        size = os.path.getsize(self.filler)
        os.truncate(self.filler, (size // 4096 - 1) * 4096)
        tid = self.sites.cli("b", "cp", "site-a:/ckpt/many", "site-b:/ckpt/step",
                             check=True).stdout.strip()
        self.wait_refused_for_space(tid)
        self.cancel("b", tid)
        self.assert_staging_removed_for_good(tid)

    def test_cancel_while_the_destination_is_down_removes_its_staging_once_it_is_back(self):
        self.sites.cli("a", "limit", "--peer", "site-b", "8Mbit", check=True)
        tid = self.sites.cli("a", "cp", self.src, "site-b:/ckpt/step", "--chunk-size", "4MiB",
                             "--streams", "1", check=True).stdout.strip()
        lh.wait_until(lambda: os.path.exists(os.path.join(self.staging(tid), "f")), 30,
                      "the transfer staged at site-b", interval=0.05)
        self.sites.kill("site-b")
        self.cancel("a", tid)  # site-b cannot be told now
        self.sites.up()
        lh.wait_until(lambda: not os.path.exists(self.staging(tid)), 60,
                      f"the staging of {tid} removed at site-b", interval=0.1)
        self.assert_staging_removed_for_good(tid)


class CorruptionTest(lh.SitesTestCase):

    def test_byte_flipped_in_a_staged_chunk_is_detected_and_resent(self):
        src = self.sites.path("src")
        expected = make_checkpoint(src, shards=2, shard_size=64 * MIB)
        # Capped, so the transfer is surely still running when it is paused
        # (a slow build, e.g. ASan, polls status slowly).
        self.sites.cli("a", "limit", "--peer", "site-b", "100Mbit", check=True)
        tid = self.sites.cli("a", "cp", src, "site-b:/ckpt/step", "--chunk-size", "4MiB",
                             "--streams", "2", check=True).stdout.strip()
        deadline = time.time() + 60
        while self.sites.status("a", tid)["bytes_done"] < 24 * MIB and time.time() < deadline:
            time.sleep(0.05)
        paused = json.loads(self.sites.cli("a", "pause", tid, "--json", check=True).stdout)
        self.assertEqual(paused["state"], "PAUSED")
        # The staged chunks were read back while receiving already; the
        # resume's re-open must have them read again.
        lh.wait_until(lambda: self.sites.metric("site-b", "longhaul_staged_bytes_read_back_total",
                                                {"when": "receiving"}) >= 4 * MIB,
                      30, "a chunk read back while receiving", interval=0.1)
        staged = os.path.join(self.sites.export("site-b"), ".longhaul/staging", tid, "f", "0")
        with open(staged, "r+b") as f:  # chunk 0 of file 0 is durable by now
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 0xFF]))
            f.flush()
            os.fsync(f.fileno())
        self.sites.cli("a", "limit", "--peer", "site-b", "off", check=True)
        self.sites.cli("a", "resume", tid, check=True)
        done = self.sites.wait_state("a", tid, {"COMPLETED", "FAILED"})
        self.assertEqual(done["state"], "COMPLETED", done.get("error"))
        self.assertEqual(lh.tree_digest(os.path.join(self.sites.export("site-b"), "step")), expected)
        self.assertIn("does not match its digest", self.sites.log("site-b"))

    def test_byte_flipped_on_the_wire_is_detected_and_resent(self):
        # A proxy between site-a and site-b flips one byte of the first data
        # connection that carries more than 2 MiB. TLS rejects the record.
        with open(self.sites.path("site-b", "longhauld.yaml")) as f:
            b_port = int([l for l in f if l.startswith("listen:")][0].rsplit(":", 1)[1])
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        proxy_port = listener.getsockname()[1]
        flipped = threading.Event()
        stop = threading.Event()

        def pipe(src_sock, dst_sock, corrupt):
            seen = 0
            try:
                while True:
                    data = src_sock.recv(1 << 16)
                    if not data:
                        break
                    if corrupt and not flipped.is_set() and seen + len(data) > 2 * MIB:
                        i = max(0, 2 * MIB - seen)
                        data = data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:]
                        flipped.set()
                    seen += len(data)
                    dst_sock.sendall(data)
            except OSError:
                pass
            finally:
                for s in (src_sock, dst_sock):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        def accept_loop():
            listener.settimeout(0.2)
            while not stop.is_set():
                try:
                    client, _ = listener.accept()
                except socket.timeout:
                    continue
                upstream = socket.create_connection(("127.0.0.1", b_port))
                threading.Thread(target=pipe, args=(client, upstream, True), daemon=True).start()
                threading.Thread(target=pipe, args=(upstream, client, False), daemon=True).start()

        proxy = threading.Thread(target=accept_loop, daemon=True)
        proxy.start()
        self.addCleanup(lambda: (stop.set(), proxy.join(), listener.close()))

        config = self.sites.path("site-a", "longhauld.yaml")
        with open(config) as f:
            text = f.read()
        with open(config, "w") as f:
            f.write(text.replace(f"127.0.0.1:{b_port}", f"127.0.0.1:{proxy_port}"))
        self.sites.kill("site-a", sig=15)
        self.sites.up()

        src = self.sites.path("src")
        expected = make_checkpoint(src, shards=2, shard_size=16 * MIB)
        proc, result = self.sites.cp(src, "site-b:/ckpt/step", "--chunk-size", "4MiB")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertTrue(flipped.is_set(), "the proxy never corrupted a byte")
        self.assertGreaterEqual(result["attempts"], 2)
        self.assertEqual(lh.tree_digest(os.path.join(self.sites.export("site-b"), "step")), expected)
        self.assertRegex(self.sites.log("site-b"), "bad record mac|decrypt|tls|ssl|failed")



READ_BACK_LINE = (r"transfer {}: read back (\d+) staged bytes against their digests in \S+ s "
                  r"\((\d+) more were read back while receiving\)")


class ReadBackCase(lh.SitesTestCase):
    """Every staged byte is read back against its digest before publish: by
    default mostly while the transfer is receiving, the rest right before
    publish."""

    def read_back(self, tid):
        """(bytes read back right before publish, bytes checked while receiving)."""
        found = re.search(READ_BACK_LINE.format(tid), self.sites.log("site-b"))
        self.assertIsNotNone(found, self.sites.log("site-b")[-3000:])
        return int(found.group(1)), int(found.group(2))

    def replicate(self):
        src = self.sites.path("src")
        expected = make_checkpoint(src, shards=2, shard_size=32 * MIB)
        total = sum(os.path.getsize(os.path.join(d, f))
                    for d, _, files in os.walk(src) for f in files)
        # Capped, so that the read-back threads keep up with the chunks.
        self.sites.cli("a", "limit", "--peer", "site-b", "200Mbit", check=True)
        proc, done = self.sites.cp(src, "site-b:/ckpt/step", "--chunk-size", "4MiB",
                                   "--streams", "2")
        self.assertEqual((done or {}).get("state"), "COMPLETED", proc.stdout + proc.stderr)
        self.assertEqual(lh.tree_digest(os.path.join(self.sites.export("site-b"), "step")), expected)
        return done["id"], total


class ReadBackWhileReceivingTest(ReadBackCase):

    def test_every_staged_byte_is_read_back_before_publish_mostly_while_receiving(self):
        tid, total = self.replicate()
        at_publish, while_receiving = self.read_back(tid)
        self.assertEqual(at_publish + while_receiving, total)
        self.assertGreater(while_receiving, total // 2)
        self.assertGreaterEqual(self.sites.metric(
            "site-b", "longhaul_staged_bytes_read_back_total", {"when": "receiving"}),
            while_receiving)
        self.assertEqual(self.sites.metric(
            "site-b", "longhaul_staged_bytes_read_back_total", {"when": "publish"}), at_publish)


class ReadBackBeforePublishOnlyTest(ReadBackCase):
    extra_config = "transfer:\n  read_back_while_receiving: false\n"

    def test_everything_is_read_back_right_before_publish(self):
        tid, total = self.replicate()
        self.assertEqual(self.read_back(tid), (total, 0))
        self.assertEqual(self.sites.metric(
            "site-b", "longhaul_staged_bytes_read_back_total", {"when": "receiving"}), 0)


class QueueRestartTest(lh.SitesTestCase):
    extra_config = "transfer:\n  max_active: 2\n"

    def test_restart_with_100_queued_transfers_completes_them_all(self):
        src = self.sites.path("src")
        files = []
        for i in range(100):
            path = os.path.join(src, f"f{i:03d}.bin")
            lh.write_random(path, 256 * 1024, seed=i)
            files.append(path)
        ids = [self.sites.cli("a", "cp", p, f"site-b:/ckpt/q/{os.path.basename(p)}",
                              check=True).stdout.strip() for p in files]
        self.sites.kill("site-a", sig=15)
        self.sites.up()
        deadline = time.time() + 300
        while time.time() < deadline:
            listing = json.loads(self.sites.cli("a", "ls", "--all", "--json", check=True).stdout)
            states = {t["id"]: t["state"] for t in listing["transfers"]}
            if all(states.get(i) in ("COMPLETED", "FAILED", "CANCELLED") for i in ids):
                break
            time.sleep(0.5)
        self.assertEqual({states[i] for i in ids}, {"COMPLETED"})
        for p in files:
            with open(p, "rb") as a, open(os.path.join(self.sites.export("site-b"), "q",
                                                       os.path.basename(p)), "rb") as b:
                self.assertEqual(a.read(), b.read())


if __name__ == "__main__":
    unittest.main()
