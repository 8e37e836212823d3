"""longhaul-faultfs (ctest label `fault`; root and /dev/fuse): the layer
itself, then longhauld with site-b's state directory and export on it.

The layer: a passthrough round trip, EIO on write and on fsync, the seed
replaying the same choices, drop-unsynced (old bytes and sizes back, synced
data kept, a file renamed into place without fsync empty), and a writer
SIGKILLed while the mount is frozen dying at once.

The daemon: EIO on every write into site-b's staging, and power losses of
site-b (freeze, SIGKILL, drop-unsynced, thaw, restart) mid-transfer and
after publish."""

import ctypes
import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "integration"))
import faultfs  # noqa: E402
import lh  # noqa: E402

MIB = 1 << 20
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2


def renameat2(src, dst, flags):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, src.encode(), -100, dst.encode(), flags) != 0:  # AT_FDCWD
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), src)


def write_synced(path, data):
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def read(path):
    with open(path, "rb") as f:
        return f.read()


def skip_reason():
    return faultfs.FaultFs.unavailable()


class LayerTest(unittest.TestCase):
    def setUp(self):
        if skip_reason():
            self.skipTest(skip_reason())
        self.dir = tempfile.mkdtemp(prefix="lh-faultfs-")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.backing = os.path.join(self.dir, "backing")
        self.mnt = os.path.join(self.dir, "mnt")
        self.fs = self.mount(self.backing, self.mnt)

    def mount(self, backing, mnt, seed=0):
        fs = faultfs.FaultFs(backing, mnt, seed=seed)
        self.addCleanup(fs.cleanup)
        return fs.mount()

    def m(self, *parts):
        return os.path.join(self.mnt, *parts)

    def b(self, *parts):
        return os.path.join(self.backing, *parts)

    def test_passthrough_round_trip(self):
        os.makedirs(self.m("d", "e"))
        write_synced(self.m("d", "f"), b"x" * 300_000)
        with open(self.m("d", "f"), "r+b") as f:
            f.seek(100_000)
            f.write(b"y" * 10)
        self.assertEqual(read(self.b("d", "f")), b"x" * 100_000 + b"y" * 10 + b"x" * 199_990)
        os.truncate(self.m("d", "f"), 1000)
        self.assertEqual(os.path.getsize(self.b("d", "f")), 1000)
        os.chmod(self.m("d", "f"), 0o640)
        os.utime(self.m("d", "f"), ns=(1_700_000_000_123_456_789, 1_700_000_000_123_456_789))
        st = os.stat(self.m("d", "f"))
        self.assertEqual(st.st_mode & 0o7777, 0o640)
        self.assertEqual(st.st_mtime_ns, 1_700_000_000_123_456_789)
        self.assertEqual(st.st_ino, os.stat(self.b("d", "f")).st_ino)
        os.link(self.m("d", "f"), self.m("d", "hard"))
        self.assertEqual(os.stat(self.m("d", "hard")).st_nlink, 2)
        os.symlink("f", self.m("d", "sym"))
        self.assertEqual(os.readlink(self.m("d", "sym")), "f")
        self.assertEqual(sorted(os.listdir(self.m("d"))), ["e", "f", "hard", "sym"])
        # The renames publish uses: no-replace and exchange.
        write_synced(self.m("new"), b"new")
        with self.assertRaises(FileExistsError):
            renameat2(self.m("new"), self.m("d", "f"), RENAME_NOREPLACE)
        renameat2(self.m("new"), self.m("d", "hard"), RENAME_EXCHANGE)
        self.assertEqual(read(self.m("d", "hard")), b"new")
        self.assertEqual(len(read(self.m("new"))), 1000)
        # Directories open, fsync and read by handle, as publish does.
        dfd = os.open(self.m("d"), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
            self.assertEqual(read(f"/proc/self/fd/{dfd}/hard"), b"new")
        finally:
            os.close(dfd)
        fd = os.open(self.m("d", "falloc"), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            os.posix_fallocate(fd, 0, 65536)
            self.assertEqual(os.fstat(fd).st_size, 65536)
        finally:
            os.close(fd)
        os.unlink(self.m("d", "falloc"))
        os.rmdir(self.m("d", "e"))
        self.assertGreater(os.statvfs(self.m()).f_blocks, 0)
        self.assertFalse(os.path.exists(self.b("d", "e")))

    def test_eio_on_write_and_on_fsync(self):
        write_synced(self.m("keep"), b"old")
        os.mkdir(self.m("other"))
        self.fs.set_eio("write", 1.0, path_substring="keep")
        with open(self.m("keep"), "r+b", buffering=0) as f:
            with self.assertRaises(OSError) as caught:
                f.write(b"new")
            self.assertEqual(caught.exception.errno, errno.EIO)
        self.assertEqual(read(self.b("keep")), b"old")
        write_synced(self.m("other", "f"), b"written")  # outside the substring
        self.fs.set_eio("fsync", 1.0)
        with open(self.m("other", "g"), "wb") as f:
            f.write(b"data")
            f.flush()
            with self.assertRaises(OSError) as caught:
                os.fsync(f.fileno())
            self.assertEqual(caught.exception.errno, errno.EIO)
        self.assertEqual(self.fs.stats()["eio_injected"], 2)
        self.fs.clear_eio()
        write_synced(self.m("keep"), b"new")
        self.assertEqual(read(self.b("keep")), b"new")

    def test_a_seed_replays_the_same_failures(self):
        def outcomes(fs, mnt):
            fs.set_eio("open", 0.5)
            got = []
            for _ in range(64):
                try:
                    os.close(os.open(os.path.join(mnt, "f"), os.O_RDONLY))
                    got.append(True)
                except OSError as e:
                    self.assertEqual(e.errno, errno.EIO)
                    got.append(False)
            fs.clear_eio()
            return got

        write_synced(self.m("f"), b"f")
        first = outcomes(self.fs, self.mnt)
        self.fs.cleanup()
        again = self.mount(self.backing, self.mnt, seed=0)
        self.assertEqual(outcomes(again, self.mnt), first)
        self.assertIn(True, first)
        self.assertIn(False, first)

    def test_drop_unsynced_undoes_every_write_since_the_last_fsync(self):
        write_synced(self.m("overwritten"), b"A" * 10_000)
        with open(self.m("overwritten"), "r+b") as f:
            f.seek(5_000)
            f.write(b"B" * 10_000)  # half over synced bytes, half past the end
        write_synced(self.m("shrunk"), b"C" * 8_000)
        os.truncate(self.m("shrunk"), 100)
        with open(self.m("shrunk"), "ab") as f:
            f.write(b"D" * 50)
        with open(self.m("synced_after"), "wb") as f:
            f.write(b"E" * 4_000)
            f.flush()
            os.fdatasync(f.fileno())
        # Publish by rename without fsync: the name is durable, the bytes not.
        with open(self.m("staged.tmp"), "wb") as f:
            f.write(b"F" * 3_000)
        os.rename(self.m("staged.tmp"), self.m("published"))
        os.mkdir(self.m("dir"))
        with open(self.m("dir", "never_synced"), "wb") as f:
            f.write(b"G" * 7)

        self.fs.freeze()
        self.fs.drop_unsynced()
        self.fs.thaw()

        self.assertEqual(read(self.m("overwritten")), b"A" * 10_000)
        self.assertEqual(read(self.m("shrunk")), b"C" * 8_000)
        self.assertEqual(read(self.m("synced_after")), b"E" * 4_000)
        self.assertEqual(os.path.getsize(self.m("published")), 0)
        self.assertFalse(os.path.exists(self.m("staged.tmp")))
        self.assertEqual(os.path.getsize(self.m("dir", "never_synced")), 0)
        stats = self.fs.stats()
        self.assertEqual(stats["files_undone"], 4)
        self.assertEqual(stats["bytes_undone"], 5_000 + 5_000 + 7_900 + 3_000 + 7)
        self.assertEqual(stats["unsynced_files"], 0)

    def test_drop_unsynced_undoes_overlapping_writes_and_truncates(self):
        original = random.Random(3).randbytes(200_000)
        write_synced(self.m("patched"), original)
        rng = random.Random(4)
        fd = os.open(self.m("patched"), os.O_RDWR)
        try:
            for i in range(60):
                offset = rng.randrange(260_000)
                if i % 15 == 14:
                    os.ftruncate(fd, offset)
                else:
                    os.pwrite(fd, rng.randbytes(rng.randrange(1, 20_000)), offset)
        finally:
            os.close(fd)
        self.assertNotEqual(read(self.m("patched")), original)
        self.fs.freeze()
        self.fs.drop_unsynced()
        self.fs.thaw()
        self.assertEqual(read(self.m("patched")), original)

    def test_sigterm_and_the_death_of_its_parent_unmount(self):
        self.fs.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.fs.proc.wait(timeout=30), 0)
        self.assertFalse(faultfs._mounted(self.mnt))
        # A parent that dies by SIGKILL takes the mount with it.
        parent = subprocess.Popen([sys.executable, "-c", (
            "import subprocess, sys\n"
            "subprocess.Popen(sys.argv[1:])\n"
            "sys.stdin.read()\n"), faultfs.binary(), self.backing, self.mnt,
            f"--control={self.dir}/orphan.sock", f"--ready-file={self.dir}/orphan.ready"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.addCleanup(parent.stdin.close)
        self.addCleanup(parent.kill)
        lh.wait_until(lambda: os.path.exists(f"{self.dir}/orphan.ready"), 30, "the mount",
                      interval=0.02)
        with open(f"{self.dir}/orphan.ready") as f:
            child = int(f.read())
        self.assertTrue(faultfs._mounted(self.mnt))
        parent.kill()
        parent.wait()
        lh.wait_until(lambda: lh.process_gone(child), 30, "longhaul-faultfs to exit",
                      interval=0.02)
        self.assertFalse(faultfs._mounted(self.mnt))

    def test_drop_unsynced_is_refused_unless_frozen(self):
        with self.assertRaisesRegex(faultfs.FaultFsError, "needs a frozen mount"):
            self.fs.drop_unsynced()

    def test_a_writer_killed_while_frozen_dies_and_its_write_is_lost(self):
        write_synced(self.m("f"), b"old")
        self.fs.freeze()
        writer = subprocess.Popen([sys.executable, "-c", (
            "import os, sys\n"
            "f = os.open(sys.argv[1], os.O_WRONLY)\n"
            "os.pwrite(f, b'new', 0)\n"
            "os.fsync(f)\n"), self.m("f")])
        self.addCleanup(writer.kill)
        # The writer's own request, not the background release of the
        # write_synced above, which may reach the mount after the freeze.
        lh.wait_until(lambda: writer.pid in self.fs.stats()["parked_pids"], 30,
                      "the writer's request held", interval=0.01)
        writer.kill()
        self.assertEqual(writer.wait(timeout=30), -signal.SIGKILL)
        stats = self.fs.stats()
        self.assertTrue(stats["frozen"])
        self.assertGreaterEqual(stats["interrupted"], 1)
        self.assertNotIn(writer.pid, stats["parked_pids"])
        self.fs.drop_unsynced()
        self.fs.thaw()
        self.assertEqual(read(self.m("f")), b"old")


class FaultFsSitesTest(unittest.TestCase):
    """site-a and site-b, with site-b's state directory and its export each
    on a longhaul-faultfs mount (backed by DIR/site-b-disk)."""

    def setUp(self):
        if skip_reason():
            self.skipTest(skip_reason())
        self.sites = lh.Sites()
        self.addCleanup(shutil.rmtree, self.sites.dir, ignore_errors=True)
        self.mounts = {}
        for part in ("state", "ckpt"):
            fs = faultfs.FaultFs(self.sites.path("site-b-disk", part),
                                 self.sites.path("site-b", part))
            self.addCleanup(fs.cleanup)  # after the daemons stop
            self.mounts[part] = fs.mount()
        self.addCleanup(self.sites.down)
        self.sites.up()
        self.src = self.sites.path("src")

    def write_tree(self, files, size, seed=0):
        for i in range(files):
            lh.write_random(os.path.join(self.src, f"__{i}_0.distcp"), size, seed=seed + i)
        lh.write_random(os.path.join(self.src, ".metadata"), 8192, seed=seed + 100)

    def dest(self, name):
        return os.path.join(self.sites.export("site-b"), name)

    def logs(self):
        return "".join(f"\n--- {s} log ---\n" + "".join(self.sites.log(s).splitlines(True)[-30:])
                       for s in ("site-a", "site-b"))

    def assert_whole(self, name):
        """`name` at site-b is the source tree: bytes, sizes, modes, mtimes."""
        self.assertEqual(lh.tree_digest(self.dest(name)), lh.tree_digest(self.src), self.logs())

    def power_loss(self, while_off=None):
        """Site-b loses power: nothing reaches its disks, it dies, every
        unsynced byte of both its mounts is lost (then `while_off` runs);
        then it starts again."""
        for fs in self.mounts.values():
            fs.freeze()
        self.sites.kill("site-b")
        for fs in self.mounts.values():
            fs.drop_unsynced()
        if while_off:
            while_off()
        for fs in self.mounts.values():
            fs.thaw()
        self.sites.up()


class DaemonEioTest(FaultFsSitesTest):
    def test_eio_on_staged_writes_keeps_retrying_and_completes_once_it_stops(self):
        self.write_tree(2, 8 * MIB)
        self.mounts["ckpt"].set_eio("write", 1.0, path_substring="/.longhaul/")
        tid = self.sites.cli("a", "cp", self.src, "site-b:/ckpt/step", check=True).stdout.strip()
        # The transfer stays RUNNING, with the I/O error as its reason, and
        # retries with backoff (up to transfer.give_up_after).
        status = lh.wait_until(
            lambda: (lambda s: s if "Input/output error" in s.get("error", "") else None)(
                self.sites.status("a", tid)), 60, "the I/O error in the status", interval=0.1)
        self.assertEqual(status["state"], "RUNNING", status)
        self.assertIn("site-b cannot store data", status["error"])
        self.assertIn("/.longhaul/staging/", status["error"])
        self.assertTrue(lh.process_alive(self.sites.pid("site-b")), self.logs())
        self.assertGreater(self.mounts["ckpt"].stats()["eio_injected"], 0)
        self.assertFalse(os.path.exists(self.dest("step")))

        self.mounts["ckpt"].clear_eio()
        done = self.sites.wait_state("a", tid, {"COMPLETED", "FAILED"}, timeout=180)
        self.assertEqual(done["state"], "COMPLETED", done)
        self.assert_whole("step")
        self.assertTrue(lh.process_alive(self.sites.pid("site-b")), self.logs())

        # Site-b serves the next transfer.
        proc, result = self.sites.cp(os.path.join(self.src, ".metadata"), "site-b:/ckpt/next")
        self.assertEqual(proc.returncode, 0, proc.stderr + self.logs())
        self.assertEqual(read(self.dest("next")), read(os.path.join(self.src, ".metadata")))


    def test_a_staging_the_cancel_could_not_remove_goes_once_the_disk_recovers(self):
        self.write_tree(2, 8 * MIB)
        ckpt = self.mounts["ckpt"]
        # Nothing under staging can be written, listed or removed: the
        # transfer keeps retrying, and its cancel cannot remove the staging.
        ckpt.set_eio("write,read,unlink", 1.0, path_substring="/.longhaul/staging/")
        tid = self.sites.cli("a", "cp", self.src, "site-b:/ckpt/step", check=True).stdout.strip()
        staging = os.path.join(self.sites.export("site-b"), ".longhaul", "staging", tid)
        lh.wait_until(lambda: "Input/output error" in self.sites.status("a", tid).get("error", ""),
                      60, "the I/O error in the status", interval=0.1)
        self.sites.cli("a", "cancel", tid, check=True)
        self.assertEqual(self.sites.wait_state("a", tid, {"CANCELLED", "FAILED"})["state"],
                         "CANCELLED")
        lh.wait_until(lambda: "its staging could not be removed yet" in self.sites.log("site-b"),
                      60, "site-b's abort to fail to remove the staging", interval=0.1)
        # The listing failed; it was not taken for an empty directory.
        self.assertIn("cannot list directory", self.sites.log("site-b"))
        self.assertTrue(os.path.isdir(staging))
        # The disk recovers: the receiver retries within seconds, not at its
        # next expiry sweep (hourly with the default incoming_expiry).
        ckpt.clear_eio()
        lh.wait_until(lambda: not os.path.exists(staging), 30,
                      f"the cancelled transfer's staging {staging} to be removed", interval=0.1)
        self.assertFalse(os.path.exists(self.dest("step")))
        self.assertTrue(lh.process_alive(self.sites.pid("site-b")), self.logs())


class DaemonPowerLossTest(FaultFsSitesTest):
    def test_power_losses_mid_transfer_end_in_a_whole_identical_tree(self):
        self.write_tree(4, 24 * MIB)
        # Capped, so that each cut lands while chunks are moving; with the
        # default chunk size a cut usually finds staged bytes not yet synced.
        self.sites.cli("a", "limit", "--peer", "site-b", "150Mbit", check=True)
        tid = self.sites.cli("a", "cp", self.src, "site-b:/ckpt/step", check=True).stdout.strip()
        for cut_at in (20 * MIB, 50 * MIB):
            lh.wait_until(lambda: self.sites.status("a", tid)["bytes_done"] >= cut_at, 120,
                          f"{cut_at} bytes durable at site-b", interval=0.05)
            self.assertNotEqual(self.sites.status("a", tid)["state"], "COMPLETED")
            self.power_loss()
            # Nothing is published half-way: the destination is absent.
            self.assertFalse(os.path.exists(self.dest("step")), self.logs())
        self.sites.cli("a", "limit", "--peer", "site-b", "off", check=True)
        done = self.sites.wait_state("a", tid, {"COMPLETED", "FAILED"}, timeout=180)
        self.assertEqual(done["state"], "COMPLETED", json.dumps(done) + self.logs())
        self.assert_whole("step")
        self.assertGreater(done["attempts"], 1)
        print(f"power losses undid {self.mounts['ckpt'].stats()['bytes_undone']} bytes of the "
              f"export, {self.mounts['state'].stats()['bytes_undone']} of the state directory",
              file=sys.stderr)

    def test_a_published_tree_survives_a_power_loss(self):
        self.write_tree(3, 4 * MIB)
        proc, _ = self.sites.cp(self.src, "site-b:/ckpt/step")
        self.assertEqual(proc.returncode, 0, proc.stderr + self.logs())
        self.power_loss()
        self.assert_whole("step")
        # A second version replaces the first by exchange; a cut right after
        # that publish leaves the new version whole.
        self.write_tree(3, 4 * MIB, seed=50)
        proc, _ = self.sites.cp(self.src, "site-b:/ckpt/step", "--replace")
        self.assertEqual(proc.returncode, 0, proc.stderr + self.logs())
        self.power_loss()
        self.assert_whole("step")

class DaemonPublishFaultTest(FaultFsSitesTest):
    def test_eio_on_the_install_then_power_loss_publishes_whole_at_restart(self):
        ckpt = self.mounts["ckpt"]
        previous = None
        for version in (1, 2):  # a new destination, then a replaced one
            self.write_tree(3, 3 * MIB, seed=10 * version)
            for k in range(50):
                lh.write_random(os.path.join(self.src, "extra", f"s{k}"), 1000 + k,
                                seed=1000 * version + k)
            # Only the install names the destination: every rename before the
            # point of no return stays inside staging.
            ckpt.set_eio("rename", 1.0, path_substring="/step")
            injected = ckpt.stats()["eio_injected"]
            tid = self.sites.cli("a", "cp", self.src, "site-b:/ckpt/step", "--replace",
                                 check=True).stdout.strip()
            lh.wait_until(lambda: ckpt.stats()["eio_injected"] > injected, 60,
                          "the install's rename to fail", interval=0.05)
            # The destination is untouched: absent, or the previous version.
            if previous is None:
                self.assertFalse(os.path.exists(self.dest("step")))
            else:
                self.assertEqual(lh.tree_digest(self.dest("step")), previous)
            self.power_loss(while_off=ckpt.clear_eio)
            # Past the point of no return, the restarted receiver finishes
            # the publish, and the sender, which kept retrying its commit,
            # completes: a failure would report a version that appeared.
            lh.wait_until(lambda: lh.tree_digest(self.dest("step")) == lh.tree_digest(self.src),
                          60, "the interrupted publish to finish", interval=0.1)
            done = self.sites.wait_state("a", tid, {"COMPLETED", "FAILED"})
            self.assertEqual(done["state"], "COMPLETED", done)
            self.assertFalse(os.path.exists(os.path.join(
                self.sites.export("site-b"), ".longhaul", "staging", tid)), self.logs())
            previous = lh.tree_digest(self.src)

    def test_eio_on_the_install_is_retried_until_it_publishes(self):
        ckpt = self.mounts["ckpt"]
        self.write_tree(3, 3 * MIB, seed=77)
        ckpt.set_eio("rename", 1.0, path_substring="/step")
        injected = ckpt.stats()["eio_injected"]
        tid = self.sites.cli("a", "cp", self.src, "site-b:/ckpt/step", check=True).stdout.strip()
        lh.wait_until(lambda: ckpt.stats()["eio_injected"] > injected, 60,
                      "the install's rename to fail", interval=0.05)
        self.assertFalse(os.path.exists(self.dest("step")))
        # The sender retries while the receiver's disk fails, and neither
        # daemon restarts: the next commit after the fault finishes the publish.
        ckpt.clear_eio()
        done = self.sites.wait_state("a", tid, {"COMPLETED", "FAILED"})
        self.assertEqual(done["state"], "COMPLETED", done)
        self.assertEqual(lh.tree_digest(self.dest("step")), lh.tree_digest(self.src))
        self.assertFalse(os.path.exists(os.path.join(
            self.sites.export("site-b"), ".longhaul", "staging", tid)), self.logs())

    def test_eio_before_the_point_of_no_return_fails_and_removes_the_staging(self):
        ckpt = self.mounts["ckpt"]
        self.write_tree(3, 3 * MIB, seed=78)
        # The renames into next/ stay inside staging: the destination is
        # not committed yet, so the transfer fails with the I/O error.
        ckpt.set_eio("rename", 1.0, path_substring="/next")
        tid = self.sites.cli("a", "cp", self.src, "site-b:/ckpt/step", check=True).stdout.strip()
        done = self.sites.wait_state("a", tid, {"COMPLETED", "FAILED"})
        self.assertEqual(done["state"], "FAILED", done)
        self.assertIn("Input/output error", done["error"])
        ckpt.clear_eio()
        # A failed transfer is over: its staging goes as a cancelled one's.
        staging = os.path.join(self.sites.export("site-b"), ".longhaul", "staging", tid)
        lh.wait_until(lambda: not os.path.exists(staging), 60,
                      f"the failed transfer's staging {staging} to be removed", interval=0.1)
        self.assertFalse(os.path.exists(self.dest("step")))


if __name__ == "__main__":
    unittest.main()
