"""What publish promises a reader of the destination, tried with real daemons:
one whole version of a checkpoint at any time (old or new, never a mix), also
when the receiver is killed mid-publish, when two transfers write one path, on
a file system with whole-second timestamps and when staged data is lost; and a
completed publish stays completed through restarts of either side."""

import json
import os
import unittest

import lh

MIB = 1 << 20
MARKER = ".metadata"


class PublishTestCase(lh.SitesTestCase):

    def dest(self, *parts):
        return os.path.join(self.sites.export("site-b"), *parts)

    def staging(self, tid):
        return self.dest(".longhaul", "staging", tid)

    def make_version(self, version, layout):
        src = self.sites.path(f"src-v{version}")
        return src, lh.write_versioned_checkpoint(src, version, layout)

    def cp_ok(self, src, rel, site="a"):
        # Each version replaces the one before: --replace, as cp refuses otherwise.
        proc = self.sites.cli(site, "cp", src, f"site-b:/ckpt/{rel}", "--replace", "--wait",
                              "--json")
        result = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
        self.assertEqual((proc.returncode, result.get("state")), (0, "COMPLETED"),
                         proc.stderr + proc.stdout)
        return result

    def cp_start(self, src, rel, site="a"):
        return self.sites.cli(site, "cp", src, f"site-b:/ckpt/{rel}", "--replace",
                              check=True).stdout.strip()

    def assert_not_completed(self, tid, when):
        state = self.sites.status("a", tid)["state"]
        self.assertNotEqual(state, "COMPLETED",
                            f"the transfer completed before {when}: the window was missed")

    def kill_receiver_mid_publish(self, tid, dest, timeout=120):
        """Kills site-b with SIGKILL at the first sign that it publishes
        `tid`: a staged file leaves staging/<id>/f, staging/<id>/tree appears,
        or the destination appears or is replaced. Returns what was seen."""
        staging = self.staging(tid)
        files_dir = os.path.join(staging, "f")
        try:
            st = os.stat(dest)
            start = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            start = None
        most = 0

        def publishing():
            nonlocal most
            try:
                n = len(os.listdir(files_dir))
                most = max(most, n)
                if n < most:
                    return f"{most - n} of {most} staged files left {files_dir}"
            except FileNotFoundError:
                if most:
                    return f"{files_dir} is gone"
            if os.path.isdir(os.path.join(staging, "tree")):
                return "staging tree/ appeared"
            try:
                st = os.stat(dest)
            except FileNotFoundError:
                return None
            if start is None:
                return "the destination appeared"
            if (st.st_dev, st.st_ino) != start:
                return "the destination was replaced"
            return None

        seen = lh.wait_until(publishing, timeout, f"site-b to start publishing {tid}")
        self.sites.kill("site-b")
        return seen

    def wait_log(self, site, text, timeout=120):
        path = self.sites.path(site, "longhauld.log")

        def found():
            with open(path) as f:
                return text in f.read()

        lh.wait_until(found, timeout, f"'{text}' in the {site} log", interval=0.001)

    def assert_whole_versions(self, watcher):
        if watcher.violations:
            self.fail(f"a reader saw more or less than one whole version: {watcher.summary()}")

    def wait_end(self, tid, site="a", timeout=120):
        return self.sites.wait_state(site, tid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout)

    def publish_intervals(self, tids):
        """{version: "start-end"} of each transfer's publish at site-b, from its
        log (the read-back before publish, then the published line)."""
        out = {}
        for line in self.sites.log("site-b").splitlines():
            stamp = line.split(" ", 1)[0][11:]
            for version, (tid, _) in tids.items():
                if f"transfer {tid}: read back" in line:
                    out[version] = stamp + "-"
                elif f"transfer {tid} from" in line and ": published " in line:
                    out[version] = out.get(version, "?-") + stamp
        return out

    def race_two_writers(self, starts, versions, dest, existed):
        """Starts every transfer in `starts` ({version: start() -> (id, site)})
        at once, with a reader watching `dest`; the destination must end as
        exactly the version of a completed transfer."""
        with lh.VersionWatcher(dest, versions, existed=existed) as watcher:
            tids = {version: start() for version, start in starts.items()}
            ends = {version: self.wait_end(tid, site) for version, (tid, site) in tids.items()}
        final = lh.which_version(dest, versions)
        print(f"\ntwo writers: final {final!r}; ends "
              f"{ {v: (e['state'], e.get('error', '')) for v, e in ends.items()} }; "
              f"publish at site-b: {self.publish_intervals(tids)}; reader: {watcher.summary()}")
        self.assertIn(final, tuple(starts), "the destination holds no single version")
        self.assertEqual(ends[final]["state"], "COMPLETED",
                         f"v{final} is at the destination but its transfer did not complete")
        self.assert_whole_versions(watcher)


class ReplaceInPlaceTest(PublishTestCase):
    """A new version over an existing one."""

    def test_reader_sees_only_whole_versions_while_v2_replaces_v1(self):
        layout = lh.versioned_checkpoint_layout(small_files=2000)
        src1, v1 = self.make_version(1, layout)
        src2, v2 = self.make_version(2, layout)
        versions = {1: v1, 2: v2}
        dest = self.dest("ck")
        self.cp_ok(src1, "ck")
        self.assertEqual(lh.which_version(dest, versions), 1)
        with lh.VersionWatcher(dest, versions, existed=True) as watcher:
            self.cp_ok(src2, "ck")
            lh.wait_until(lambda: watcher.seen.get(2), 30, "the reader to see v2 whole")
        self.assert_whole_versions(watcher)
        self.assertEqual(lh.which_version(dest, versions), 2)

    def replace_and_kill(self):
        layout = lh.versioned_checkpoint_layout(small_files=600)
        src1, v1 = self.make_version(1, layout)
        src2, v2 = self.make_version(2, layout)
        versions = {1: v1, 2: v2}
        dest = self.dest("ck")
        self.cp_ok(src1, "ck")
        watcher = lh.VersionWatcher(dest, versions, existed=True)
        watcher.start()
        self.addCleanup(watcher.stop)
        tid = self.cp_start(src2, "ck")
        seen = self.kill_receiver_mid_publish(tid, dest)
        self.assert_not_completed(tid, f"site-b was killed ({seen})")
        return tid, dest, versions, watcher, seen

    def test_receiver_killed_mid_publish_then_cancelled_leaves_one_whole_version(self):
        tid, dest, versions, watcher, seen = self.replace_and_kill()
        paused = json.loads(self.sites.cli("a", "pause", tid, "--json", check=True).stdout)
        self.assertEqual(paused["state"], "PAUSED")
        cancelled = json.loads(self.sites.cli("a", "cancel", tid, "--json", check=True).stdout)
        self.assertEqual(cancelled["state"], "CANCELLED")
        self.sites.up()
        after_restart = lh.which_version(dest, versions)
        watcher.stop()
        self.assertIn(after_restart, (1, 2), f"killed when {seen}, then cancelled")
        self.assert_whole_versions(watcher)

    def test_receiver_killed_mid_publish_converges_to_v2_by_itself(self):
        tid, dest, versions, watcher, seen = self.replace_and_kill()
        self.sites.up()
        done = self.wait_end(tid)
        watcher.stop()
        self.assertEqual(done["state"], "COMPLETED", f"killed when {seen}: {done.get('error')}")
        self.assertEqual(lh.which_version(dest, versions), 2, f"killed when {seen}")
        self.assert_whole_versions(watcher)


class TwoWritersTest(PublishTestCase):
    """Two transfers into one destination at once."""

    def test_two_transfers_over_an_existing_version_leave_one_whole_version(self):
        layout = lh.versioned_checkpoint_layout(small_files=600)
        src1, v1 = self.make_version(1, layout)
        src7, v7 = self.make_version(7, layout)
        src8, v8 = self.make_version(8, layout)
        self.cp_ok(src1, "ck")
        starts = {
            7: lambda: (self.cp_start(src7, "ck"), "a"),
            8: lambda: (self.cp_start(src8, "ck"), "a"),
        }
        self.race_two_writers(starts, {1: v1, 7: v7, 8: v8}, self.dest("ck"), existed=True)


class TwoSitesOnePathTest(PublishTestCase):
    """Two source sites send to one new destination at once."""

    site_names = ("site-a", "site-b", "site-c")

    def test_two_sites_writing_one_new_path_leave_one_whole_version(self):
        layout = lh.versioned_checkpoint_layout(small_files=600)
        src7, v7 = self.make_version(7, layout)
        src8, v8 = self.make_version(8, layout)
        starts = {
            7: lambda: (self.cp_start(src7, "ck", site="a"), "a"),
            8: lambda: (self.cp_start(src8, "ck", site="c"), "c"),
        }
        self.race_two_writers(starts, {7: v7, 8: v8}, self.dest("ck"), existed=False)


class CoarseTimestampsTest(PublishTestCase):
    """site-b's export keeps whole-second timestamps only (ext4 with
    128-byte inodes), so mtimes set with ns precision come back truncated."""

    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("needs root: loop-mounts an ext4 image (mkfs.ext4 -I 128, whole-second "
                          "timestamps) as site-b's export")
        self.sites = lh.Sites(self.extra_config, self.site_names)
        self.addCleanup(self.sites.cleanup)
        mount = lh.LoopMount(self.sites.path("site-b-export.img"), 512 * MIB,
                             self.sites.export("site-b"), ["mkfs.ext4", "-q", "-F", "-I", "128"])
        self.addCleanup(mount.cleanup)
        self.addCleanup(self.sites.down)  # before the unmount
        mount.mount()
        self.sites.up()

    def make_checkpoint(self, small_files):
        src = self.sites.path("src")
        for i in range(4):
            lh.write_random(os.path.join(src, f"__{i}_0.distcp"), 4 * MIB, seed=i)
        for k in range(small_files):
            lh.write_random(os.path.join(src, f"extra/{k // 100:02d}/item_{k:04d}.bin"), 300,
                            seed=100 + k)
        lh.write_random(os.path.join(src, MARKER), 4096, seed=99)
        for dirpath, _, names in os.walk(src):
            for name in names:  # a sub-second part that the export cannot keep
                path = os.path.join(dirpath, name)
                mtime = os.stat(path).st_mtime_ns // 10**9 * 10**9 + 987_654_321
                os.utime(path, ns=(mtime, mtime))
        return src

    def assert_same_at_seconds(self, src, dest):
        want = lh.tree_digest(src)
        got = lh.tree_digest(dest)
        self.assertEqual({rel: d[:3] for rel, d in got.items()},
                         {rel: d[:3] for rel, d in want.items()})
        self.assertEqual({rel: d[3] for rel, d in got.items()},
                         {rel: d[3] // 10**9 * 10**9 for rel, d in want.items()})

    def test_copy_to_a_new_directory_completes_byte_identical(self):
        src = self.make_checkpoint(small_files=50)
        self.cp_ok(src, "ck")
        self.assert_same_at_seconds(src, self.dest("ck"))

    def test_receiver_killed_mid_publish_resumes(self):
        src = self.make_checkpoint(small_files=600)
        tid = self.cp_start(src, "ck")
        seen = self.kill_receiver_mid_publish(tid, self.dest("ck"))
        self.assert_not_completed(tid, f"site-b was killed ({seen})")
        self.sites.up()
        done = self.wait_end(tid)
        self.assertEqual(done["state"], "COMPLETED", f"killed when {seen}: {done.get('error')}")
        self.assert_same_at_seconds(src, self.dest("ck"))


class LostStagingTest(PublishTestCase):
    """A staged file acknowledged durable disappears before publish."""

    def test_deleted_staged_file_is_sent_again(self):
        src = self.sites.path("src")
        for i in range(2):
            lh.write_random(os.path.join(src, f"__{i}_0.distcp"), 32 * MIB, seed=i)
        lh.write_random(os.path.join(src, MARKER), 4096, seed=9)
        # Capped, so that the transfer is still running when it is paused.
        self.sites.cli("a", "limit", "--peer", "site-b", "100Mbit", check=True)
        tid = self.sites.cli("a", "cp", src, "site-b:/ckpt/ck", "--chunk-size", "4MiB",
                             "--streams", "2", check=True).stdout.strip()
        lh.wait_until(lambda: self.sites.status("a", tid)["bytes_done"] > 0, 60,
                      "a durable chunk", interval=0.02)
        paused = json.loads(self.sites.cli("a", "pause", tid, "--json", check=True).stdout)
        self.assertEqual(paused["state"], "PAUSED")
        self.assertGreater(paused["bytes_done"], 0)
        files_dir = os.path.join(self.staging(tid), "f")
        staged = sorted(os.listdir(files_dir), key=int)
        self.assertTrue(staged, "nothing staged although chunks are durable")
        os.unlink(os.path.join(files_dir, staged[-1]))
        self.sites.cli("a", "limit", "--peer", "site-b", "off", check=True)
        self.sites.cli("a", "resume", tid, check=True)
        done = self.wait_end(tid)
        self.assertEqual(done["state"], "COMPLETED", done.get("error"))
        self.assertEqual(lh.tree_digest(src), lh.tree_digest(self.dest("ck")))


class CompletedPublishStaysCompletedTest(PublishTestCase):
    """site-b journals PUBLISHED, then prunes old checkpoints
    (`sync --keep 1`) before it answers the commit; it dies in between."""

    OLD_FILES = 10000

    def setUp(self):
        super().setUp()
        # The old checkpoint that the prune after the publish removes. site-a
        # publishes it (retention removes only what the same source site
        # published); then it gets many files, so the prune (and the
        # sender's wait for its commit answer) takes a while.
        self.run_dir = self.sites.path("run1")
        # Complete (it holds its marker), so retention counts and prunes it.
        lh.write_random(os.path.join(self.run_dir, "step-1", MARKER), 16, seed=3)
        self.sites.cli("a", "sync", self.run_dir, "site-b:/ckpt/run1", "--keep", "1", "--wait",
                       check=True)
        old = self.dest("run1", "step-1")
        self.assertTrue(os.path.exists(os.path.join(old, MARKER)))
        for d in range(100):
            os.makedirs(os.path.join(old, f"d{d:02d}"))
        for k in range(self.OLD_FILES):
            os.close(os.open(os.path.join(old, f"d{k % 100:02d}", f"f{k}"),
                             os.O_CREAT | os.O_WRONLY, 0o644))
        lh.write_random(os.path.join(self.run_dir, "step-2", "shard-0.pt"), 2 * MIB, seed=1)
        lh.write_random(os.path.join(self.run_dir, "step-2", MARKER), 1024, seed=2)

    def start_sync(self):
        # One line per checkpoint: its transfer id, then its name.
        return self.sites.cli("a", "sync", self.run_dir, "site-b:/ckpt/run1", "--keep", "1",
                              check=True).stdout.split()[0]

    def assert_published(self):
        self.assertEqual(lh.tree_digest(os.path.join(self.run_dir, "step-2")),
                         lh.tree_digest(self.dest("run1", "step-2")))

    def kill_receiver_after_publish(self):
        tid = self.start_sync()
        self.wait_log("site-b", f"transfer {tid} from site-a: published")
        self.sites.kill("site-b")
        self.assert_not_completed(tid, "site-b was killed after journaling PUBLISHED")
        return tid

    def test_receiver_restart_after_publish_completes(self):
        tid = self.kill_receiver_after_publish()
        self.sites.up()
        done = self.wait_end(tid)
        if done["state"] != "COMPLETED":
            resumed = self.sites.cli("a", "resume", tid)
            again = self.wait_end(tid) if resumed.returncode == 0 else {"state": resumed.stderr}
            self.fail(f"ended {done['state']} ({done.get('error')}); after resume: "
                      f"{again['state']} ({again.get('error')})")
        self.assert_published()

    def test_both_restart_after_publish_completes(self):
        tid = self.kill_receiver_after_publish()
        self.sites.kill("site-a")
        self.sites.up()
        done = self.wait_end(tid)
        self.assertEqual(done["state"], "COMPLETED", done.get("error"))
        self.assert_published()
        # Once more: a restart of the sender after COMPLETED keeps it so.
        self.sites.kill("site-a")
        self.sites.up()
        self.assertEqual(self.sites.status("a", tid)["state"], "COMPLETED")

    def test_cancel_that_arrives_after_the_publish_reports_completed(self):
        tid = self.start_sync()
        self.wait_log("site-b", f"transfer {tid} from site-a: published")
        cancel = self.sites.cli("a", "cancel", tid)
        self.assertIn("already published", cancel.stderr + cancel.stdout)
        self.assertEqual(self.sites.status("a", tid)["state"], "COMPLETED")
        self.assert_published()


if __name__ == "__main__":
    unittest.main()
