"""Crashes, restarts and changing sources: transfers finish byte-identical,
re-send little, and never show a partial tree."""

import os
import signal
import subprocess
import threading
import time
import unittest

import lh

MIB = 1 << 20
CHUNK = 8 * MIB
STREAMS = 4


class ResumeTest(lh.SitesTestCase):

    def start_big_transfer(self, files=3, size=128 * MIB):
        src = self.sites.path("src")
        for i in range(files):
            lh.write_random(os.path.join(src, f"shard_{i}.bin"), size, seed=i)
        tid = self.sites.cli("a", "cp", src, "site-b:/ckpt/big", "--chunk-size", "8MiB",
                             "--streams", str(STREAMS), check=True).stdout.strip()
        return src, tid

    def wait_progress(self, tid, fraction):
        deadline = time.time() + 120
        while time.time() < deadline:
            s = self.sites.status("a", tid)
            if s["bytes"] and s["bytes_done"] >= fraction * s["bytes"]:
                return s
            if s["state"] == "COMPLETED":
                self.fail("transfer finished before the crash point; make it larger")
            time.sleep(0.02)
        self.fail("no progress")

    def assert_identical(self, src):
        dest = os.path.join(self.sites.export("site-b"), "big")
        self.assertEqual(lh.tree_digest(src), lh.tree_digest(dest))

    def test_receiver_sigkill_mid_transfer_resumes_by_itself(self):
        src, tid = self.start_big_transfer()
        self.wait_progress(tid, 0.3)
        self.sites.kill("site-b")
        self.sites.up()  # restarts site-b only
        done = self.sites.wait_state("a", tid, {"COMPLETED", "FAILED"})
        self.assertEqual(done["state"], "COMPLETED", done.get("error"))
        self.assert_identical(src)
        # Durable pieces: per stream at most one chunk size was unacknowledged
        # when the receiver died, and chunks resume from their durable prefix.
        self.assertLessEqual(done["resent_bytes"], STREAMS * CHUNK)
        self.assertGreaterEqual(done["attempts"], 2)

    def test_sender_sigkill_mid_transfer_resumes_after_restart(self):
        src, tid = self.start_big_transfer()
        self.wait_progress(tid, 0.3)
        self.sites.kill("site-a")
        self.sites.up()  # restarts site-a, which resumes from its journal
        done = self.sites.wait_state("a", tid, {"COMPLETED", "FAILED"})
        self.assertEqual(done["state"], "COMPLETED", done.get("error"))
        self.assert_identical(src)
        self.assertLessEqual(done["resent_bytes"], STREAMS * CHUNK)

    def test_sigterm_drains_and_restart_continues(self):
        src, tid = self.start_big_transfer()
        self.wait_progress(tid, 0.2)
        self.sites.kill("site-a", sig=15)
        self.assertIn("stopped cleanly", self.sites.log("site-a"))
        self.sites.up()
        done = self.sites.wait_state("a", tid, {"COMPLETED", "FAILED"})
        self.assertEqual(done["state"], "COMPLETED", done.get("error"))
        self.assert_identical(src)
        # A drain lets chunks in flight finish: nothing needs sending twice.
        self.assertEqual(done["resent_bytes"], 0)

    def test_destination_never_shows_a_partial_tree(self):
        src = self.sites.path("src")
        names = [f"__{i}_0.distcp" for i in range(6)]
        for i, name in enumerate(names):
            lh.write_random(os.path.join(src, name), 24 * MIB, seed=i)
        lh.write_random(os.path.join(src, ".metadata"), 4096, seed=100)
        expected = lh.tree_digest(src)
        dest = os.path.join(self.sites.export("site-b"), "step")
        violations = []
        seen_complete = threading.Event()
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                if not os.path.exists(dest):
                    continue
                present = {}
                for name in os.listdir(dest):
                    try:
                        present[name] = os.stat(os.path.join(dest, name)).st_size
                    except FileNotFoundError:
                        pass
                others = [n for n in names if n not in present or present[n] != 24 * MIB]
                if others:
                    violations.append(f"destination visible without {others}")
                if ".metadata" in present:
                    seen_complete.set()
                    if others:
                        violations.append("commit marker visible before the shards")

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            proc, result = self.sites.cp(src, "site-b:/ckpt/step", "--chunk-size", "4MiB")
        finally:
            stop.set()
            watcher.join()
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(violations, [])
        self.assertEqual(lh.tree_digest(dest), expected)

    def test_source_changed_mid_transfer_is_resent_whole(self):
        src = self.sites.path("src")
        path = os.path.join(src, "weights.bin")
        lh.write_random(path, 384 * MIB, seed=1)
        tid = self.sites.cli("a", "cp", src, "site-b:/ckpt/w", "--chunk-size", "8MiB",
                             "--streams", "2", check=True).stdout.strip()
        self.wait_progress(tid, 0.2)
        # Rewrite in place: same size, new content, new mtime.
        lh.rewrite_in_place(path, 384 * MIB, seed=2)
        done = self.sites.wait_state("a", tid, {"COMPLETED", "FAILED"}, timeout=180)
        self.assertEqual(done["state"], "COMPLETED", done.get("error"))
        dest = os.path.join(self.sites.export("site-b"), "w")
        self.assertEqual(lh.tree_digest(src), lh.tree_digest(dest))


class WaitAcrossRestartTest(lh.SitesTestCase):
    """`cp --wait` follows its transfer across a restart of the local daemon:
    its exit code is the transfer's, not the lost connection's."""

    def start_waiting_copy(self, *extra):
        """A copy of a few seconds (capped) followed by `cp --wait`; returns
        (src, the CLI's Popen) once the CLI printed its first progress line,
        i.e. is following the transfer."""
        src = self.sites.path("src")
        for i in range(3):
            lh.write_random(os.path.join(src, f"shard_{i}.bin"), 64 * MIB, seed=i)
        self.sites.cli("a", "limit", "--peer", "site-b", "200Mbit", check=True)
        cmd = [os.path.join(lh.BIN, "longhaul"), "--daemon", self.sites.env["LONGHAUL_SITE_A"],
               *extra, "cp", src, "site-b:/ckpt/big", "--chunk-size", "8MiB", "--wait"]
        if lh.TRANSPORT:
            cmd += ["--transport", lh.TRANSPORT]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.addCleanup(lambda: proc.poll() is None and (proc.kill(), proc.communicate()))
        if not proc.stdout.readline():
            self.fail(f"cp --wait printed no progress: {proc.communicate()}")
        return src, proc

    def test_wait_survives_a_sigkill_and_restart_of_the_local_daemon(self):
        src, proc = self.start_waiting_copy()
        self.sites.kill("site-a", signal.SIGKILL)
        # Down until the CLI has noticed: its first word on stderr.
        noticed = proc.stderr.readline()
        self.sites.up()  # restarts site-a, which resumes the transfer from its journal
        out, err = proc.communicate(timeout=300)
        self.assertEqual(proc.returncode, 0, noticed + out + err)
        self.assertIn("lost longhauld while waiting for transfer", noticed)
        self.assertIn("COMPLETED", out)
        self.assertEqual(lh.tree_digest(src),
                         lh.tree_digest(os.path.join(self.sites.export("site-b"), "big")))

    def test_daemon_that_does_not_come_back_exits_3_naming_the_transfer(self):
        _, proc = self.start_waiting_copy("--reconnect-timeout", "1s")
        self.sites.kill("site-a", signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
        self.assertEqual(proc.returncode, 3, out + err)
        self.assertIn("did not come back within 1s", err)
        self.assertIn("longhaul status", err)


if __name__ == "__main__":
    unittest.main()
