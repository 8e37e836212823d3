"""A full state disk (ctest label `fault`; root: mounts a tmpfs): the daemon
keeps serving, the transfers it hits pause with an error that says what to
do, and they finish byte-identical once space is freed.

Each test puts one site's state directory (DIR/SITE/state, which holds the
journal) on a small tmpfs, starts a transfer, then fills that file system
with a filler file so that journal writes fail with ENOSPC."""

import json
import os
import shutil
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import lh  # noqa: E402

MIB = 1 << 20
STATE_DISK = "64m"


class StateDiskTest(unittest.TestCase):
    full_site = ""  # the site whose state directory is on the small tmpfs

    def setUp(self):
        self.sites = lh.Sites()
        self.state = self.sites.path(self.full_site, "state")
        os.makedirs(self.state)
        self.addCleanup(self.cleanup)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={STATE_DISK}", "tmpfs", self.state],
                       check=True)
        self.filler = os.path.join(self.state, "filler")
        self.sites.up()
        self.pids = {s: self.sites.pid(s) for s in ("site-a", "site-b")}

    def cleanup(self):
        self.sites.down()
        if os.path.ismount(self.state) and subprocess.run(["umount", self.state]).returncode != 0:
            subprocess.run(["umount", "-l", self.state])
        shutil.rmtree(self.sites.dir, ignore_errors=True)

    def start_transfer(self):
        src = self.sites.path("src")
        for i in range(2):
            lh.write_random(os.path.join(src, f"__{i}_0.distcp"), 96 * MIB, seed=i)
        lh.write_random(os.path.join(src, ".metadata"), 8192, seed=100)
        # Capped, so that the disk fills while chunks are still moving.
        self.sites.cli("a", "limit", "--peer", "site-b", "200Mbit", check=True)
        tid = self.sites.cli("a", "cp", src, "site-b:/ckpt/step", "--chunk-size", "256KiB",
                             "--streams", "4", check=True).stdout.strip()
        deadline = time.time() + 60
        while self.sites.status("a", tid)["bytes_done"] < 16 * MIB:
            self.assertLess(time.time(), deadline, "no progress before the disk was filled")
            time.sleep(0.05)
        return src, tid

    def wait_error(self, tid, text, timeout=60):
        deadline = time.time() + timeout
        status = None
        while time.time() < deadline:
            self.assert_daemons_alive()
            status = self.sites.status("a", tid)
            if text in status.get("error", ""):
                return status
            time.sleep(0.2)
        self.fail(f"no error with {text!r} in {timeout}s: {status}\n{self.logs()}")

    def assert_daemons_alive(self):
        for site, pid in self.pids.items():
            self.assertTrue(lh.process_alive(pid), f"{site} died:\n{self.logs()}")

    def logs(self):
        return "".join(f"\n--- {s} log ---\n" + "".join(self.sites.log(s).splitlines(True)[-30:])
                       for s in ("site-a", "site-b"))

    def assert_published(self, src):
        dest = os.path.join(self.sites.export("site-b"), "step")
        self.assertEqual(lh.tree_digest(dest), lh.tree_digest(src))


class SenderStateDiskTest(StateDiskTest):
    full_site = "site-a"

    def test_full_state_disk_pauses_the_transfer_and_resume_completes_it(self):
        src, tid = self.start_transfer()
        lh.fill_filesystem(self.filler)
        status = self.wait_error(tid, "state disk full")
        deadline = time.time() + 60
        while status["state"] != "PAUSED" and time.time() < deadline:
            time.sleep(0.2)
            status = self.sites.status("a", tid)
        self.assertEqual(status["state"], "PAUSED", status)
        self.assertIn(self.state, status["error"])
        self.assertIn("No space left on device", status["error"])
        self.assertIn(f"longhaul resume {tid}", status["error"])

        # The daemon keeps serving: status and ls answer, a new Submit is
        # refused with the same cause instead of being lost.
        listing = json.loads(self.sites.cli("a", "ls", "--all", "--json", check=True).stdout)
        self.assertIn(tid, [t["id"] for t in listing["transfers"]])
        refused = self.sites.cli("a", "cp", os.path.join(src, ".metadata"),
                                 "site-b:/ckpt/other.metadata")
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn("state disk full", refused.stderr + refused.stdout)
        time.sleep(2)
        self.assert_daemons_alive()
        self.assertEqual(self.sites.status("a", tid)["state"], "PAUSED")

        # Still full: resume says so and the transfer stays paused.
        still = self.sites.cli("a", "resume", tid)
        self.assertNotEqual(still.returncode, 0, still.stdout)
        self.assertIn("state disk full", still.stderr + still.stdout)
        self.assertEqual(self.sites.status("a", tid)["state"], "PAUSED")

        os.unlink(self.filler)
        self.sites.cli("a", "limit", "--peer", "site-b", "off", check=True)
        self.sites.cli("a", "resume", tid, check=True)
        done = self.sites.wait_state("a", tid, {"COMPLETED", "FAILED"})
        self.assertEqual(done["state"], "COMPLETED", done.get("error"))
        self.assert_published(src)
        self.assert_daemons_alive()

        # The journal took writes again, and they survive a restart.
        self.sites.kill("site-a", sig=15)
        self.sites.up()
        self.assertEqual(self.sites.status("a", tid)["state"], "COMPLETED")


class ReceiverStateDiskTest(StateDiskTest):
    full_site = "site-b"

    def test_full_receiver_state_disk_acknowledges_nothing_and_the_transfer_waits(self):
        src, tid = self.start_transfer()
        lh.fill_filesystem(self.filler)
        status = self.wait_error(tid, "state disk full")
        self.assertIn("site-b", status["error"])
        self.assertEqual(status["state"], "RUNNING", status)  # waiting, not failed

        # No chunk is acknowledged while its journal record cannot be written.
        done_before = status["bytes_done"]
        time.sleep(3)
        self.assert_daemons_alive()
        status = self.sites.status("a", tid)
        self.assertEqual(status["bytes_done"], done_before, status)
        self.assertEqual(status["state"], "RUNNING", status)
        self.assertFalse(os.path.exists(os.path.join(self.sites.export("site-b"), "step")))

        os.unlink(self.filler)
        self.sites.cli("a", "limit", "--peer", "site-b", "off", check=True)
        done = self.sites.wait_state("a", tid, {"COMPLETED", "FAILED"}, timeout=180)
        self.assertEqual(done["state"], "COMPLETED", done.get("error"))
        self.assert_published(src)
        self.assert_daemons_alive()


if __name__ == "__main__":
    unittest.main()
