"""Source files that change while they are being sent: the destination ends
up with the final content, never a mix of old and new chunks, even when the
writer restores the file's size and mtime."""

import os
import random
import time
import unittest

import lh

MIB = 1 << 20
SIZE = 64 * MIB


def rewrite_in_place(path, seed):
    """Overwrites every byte of `path` in one write, without truncating it
    (same size, same inode), as a tool that rewrites a file in place does.
    The new bytes are made first, so the file is being written only briefly."""
    size = os.path.getsize(path)
    data = random.Random(seed).randbytes(size)
    fd = os.open(path, os.O_WRONLY)
    try:
        assert os.pwrite(fd, data, 0) == size
    finally:
        os.close(fd)


def restore_times(path, st):
    """Puts back the atime and mtime of `st`, as `touch -r` does; only the
    ctime still tells that the file changed."""
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = os.stat(path)
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    assert now.st_ctime_ns != st.st_ctime_ns


class SourceChangeTest(lh.SitesTestCase):

    def setUp(self):
        super().setUp()
        self.src = self.sites.path("src")
        self.file = os.path.join(self.src, "weights.bin")
        lh.write_random(self.file, SIZE, seed=1)
        lh.write_random(os.path.join(self.src, "other.bin"), 4 * MIB, seed=3)
        self.dest = os.path.join(self.sites.export("site-b"), "w")

    def start(self):
        return self.sites.cli("a", "cp", self.src, "site-b:/ckpt/w", "--chunk-size", "4MiB",
                              "--streams", "2", check=True).stdout.strip()

    def wait_progress(self, tid, fraction):
        deadline = time.time() + 120
        while time.time() < deadline:
            s = self.sites.status("a", tid)
            if s["state"] in ("PUBLISHING", "COMPLETED", "FAILED"):
                self.fail(f"transfer reached {s['state']} before the rewrite; slow the link more")
            if s["bytes"] and s["bytes_done"] >= fraction * s["bytes"]:
                return s
            time.sleep(0.02)
        self.fail("no progress")

    def limit(self, rate):
        self.sites.cli("a", "limit", "--peer", "site-b", rate, check=True)

    def test_rewrite_with_mtime_restored_mid_transfer_is_resent_whole(self):
        before = os.stat(self.file)
        # About 13 s for the whole transfer: the rewrite takes a few ms, far
        # from the end, and most likely between two chunk reads.
        self.limit("40Mbit")
        tid = self.start()
        self.wait_progress(tid, 0.3)
        rewrite_in_place(self.file, seed=2)
        restore_times(self.file, before)
        mid = self.sites.status("a", tid)
        self.assertNotIn(mid["state"], ("PUBLISHING", "COMPLETED"),
                         "the transfer ended before the rewrite did; slow the link more")
        self.limit("off")
        done = self.sites.wait_state("a", tid, {"COMPLETED", "FAILED"}, timeout=180)
        self.assertEqual(done["state"], "COMPLETED", done.get("error"))
        self.assertEqual(lh.tree_digest(self.src), lh.tree_digest(self.dest))
        verify = self.sites.cli("a", "verify", tid)
        self.assertEqual(verify.returncode, 0, verify.stdout + verify.stderr)

    def test_rewrite_with_mtime_restored_while_the_sender_is_down(self):
        before = os.stat(self.file)
        self.limit("40Mbit")
        tid = self.start()
        self.wait_progress(tid, 0.3)
        self.sites.kill("site-a")
        rewrite_in_place(self.file, seed=2)
        restore_times(self.file, before)
        self.sites.up()  # site-a resumes from its journal; the limit is gone with the restart
        done = self.sites.wait_state("a", tid, {"COMPLETED", "FAILED"}, timeout=180)
        self.assertEqual(done["state"], "COMPLETED", done.get("error"))
        self.assertEqual(lh.tree_digest(self.src), lh.tree_digest(self.dest))


if __name__ == "__main__":
    unittest.main()
