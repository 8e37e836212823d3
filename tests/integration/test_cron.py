"""Cron replication: `longhaul sync --keep K [--only-complete MARKER]`,
overlapping sync runs that attach to each other instead of racing, and
`sync --checksum`, which compares destination content by digest."""

import json
import os
import subprocess
import unittest

import lh

MIB = 1 << 20
MARKER = "model.index.json"


def make_checkpoint(run_dir, name, seed, complete=True, shard_size=256 * 1024, marker=MARKER,
                    shards=2):
    """RUN/NAME with `shards` shards and, when complete, the commit marker."""
    for i in range(shards):
        lh.write_random(os.path.join(run_dir, name, f"shard-{i}.pt"), shard_size, seed=seed * 10 + i)
    if complete:
        with open(os.path.join(run_dir, name, marker), "w") as f:
            json.dump({"step": name, "shards": shards}, f)


def make_dcp_checkpoint(run_dir, name, seed, shards_written=4):
    """A PyTorch DCP checkpoint of 4 shards; `.metadata` is written last, so
    with fewer than 4 shards written it is still in progress."""
    for i in range(shards_written):
        lh.write_random(os.path.join(run_dir, name, f"__{i}_0.distcp"), 128 * 1024, seed=seed * 10 + i)
    if shards_written == 4:
        lh.write_random(os.path.join(run_dir, name, ".metadata"), 4096, seed=seed * 10 + 9)


class CronSyncTest(lh.SitesTestCase):

    def dest(self, *parts):
        return os.path.join(self.sites.export("site-b"), "run1", *parts)

    def sync(self, run_dir, *flags, check=True):
        return self.sites.cli("a", "sync", run_dir, "site-b:/ckpt/run1", "--wait", "--json", *flags,
                              check=check)

    def test_keeps_the_newest_complete_checkpoints_at_both_runs(self):
        run = self.sites.path("run1")
        for step in (1, 2, 3, 10):
            make_checkpoint(run, f"step-{step}", seed=step)
        make_checkpoint(run, "step-11", seed=11, complete=False)  # still being written

        first = self.sync(run, "--keep", "2", "--only-complete", MARKER)
        self.assertIn("skipping step-11", first.stderr)
        # Natural order: step-10 is newer than step-3.
        self.assertEqual(sorted(os.listdir(self.dest())), ["step-10", "step-3"])
        for name in ("step-3", "step-10"):
            self.assertEqual(lh.tree_digest(os.path.join(run, name)), lh.tree_digest(self.dest(name)))
        self.assertFalse(os.path.exists(os.path.join(self.sites.export("site-b"), "run1", "step-11")))

        # step-11 is finished and step-12 appears: the next run sends both and
        # the destination drops step-3 and step-10.
        with open(os.path.join(run, "step-11", MARKER), "w") as f:
            f.write("{}")
        make_checkpoint(run, "step-12", seed=12)
        second = self.sync(run, "--keep", "2", "--only-complete", MARKER)
        finals = [json.loads(line) for line in second.stdout.splitlines()]
        self.assertEqual([f["state"] for f in finals], ["COMPLETED", "COMPLETED"])
        self.assertEqual(sorted(os.listdir(self.dest())), ["step-11", "step-12"])
        for name in ("step-11", "step-12"):
            self.assertEqual(lh.tree_digest(os.path.join(run, name)), lh.tree_digest(self.dest(name)))
        removed = [name for line in self.sites.log("site-b").splitlines() if "; removed " in line
                   for name in line.split("; removed ")[1].split(", ")]
        self.assertEqual(sorted(removed), ["step-10", "step-3"])

        # Idempotent: a third run sends nothing and removes nothing.
        third = self.sync(run, "--keep", "2", "--only-complete", MARKER)
        for f in (json.loads(line) for line in third.stdout.splitlines()):
            self.assertEqual(f["bytes_sent"], 0)
        self.assertEqual(sorted(os.listdir(self.dest())), ["step-11", "step-12"])

    def test_only_complete_without_keep_sends_every_finished_checkpoint(self):
        run = self.sites.path("run1")
        make_checkpoint(run, "a", seed=1)
        make_checkpoint(run, "b", seed=2, complete=False)
        self.sync(run, "--only-complete", MARKER)
        self.assertEqual(os.listdir(self.dest()), ["a"])

    def test_nothing_complete_is_not_an_error(self):
        run = self.sites.path("run1")
        make_checkpoint(run, "step-1", seed=1, complete=False)
        proc = self.sync(run, "--keep", "3", "--only-complete", MARKER)
        self.assertIn("no complete checkpoint", proc.stderr)
        self.assertFalse(os.path.exists(self.dest()))

    def test_bad_usage_is_refused_with_what_to_fix(self):
        run = self.sites.path("run1")
        make_checkpoint(run, "step-1", seed=1)
        two = self.sites.cli("a", "sync", run, run, "site-b:/ckpt/run1", "--keep", "1")
        self.assertEqual(two.returncode, 2)
        self.assertIn("give one SRC", two.stderr)
        escaping = self.sync(run, "--only-complete", "../../etc/passwd", check=False)
        self.assertEqual(escaping.returncode, 2, escaping.stderr)
        self.assertIn("must be a file path inside the checkpoint", escaping.stderr)

    def test_overlapping_runs_attach_to_the_running_sync(self):
        run = self.sites.path("run1")
        make_checkpoint(run, "step-1", seed=1, shard_size=16 * MIB)
        # Slow the link so the first run is still going when the second starts.
        self.sites.cli("a", "limit", "--peer", "site-b", "40Mbit", check=True)
        cmd = [os.path.join(lh.BIN, "longhaul"), "--daemon", self.sites.env["LONGHAUL_SITE_A"], "sync",
               run, "site-b:/ckpt/run1", "--keep", "1", "--only-complete", MARKER, "--json"]
        if lh.TRANSPORT:
            cmd += ["--transport", lh.TRANSPORT]
        first = subprocess.run(cmd, capture_output=True, text=True, check=True)
        second = subprocess.run(cmd, capture_output=True, text=True, check=True)
        a, b = json.loads(first.stdout), json.loads(second.stdout)
        self.assertEqual(a["id"], b["id"], "the second run should attach to the first")
        self.assertNotIn(a["state"], ("COMPLETED", "FAILED", "CANCELLED"))
        self.assertIn("attaches to transfer " + a["id"], self.sites.log("site-a"))
        self.sites.cli("a", "limit", "--peer", "site-b", "off", check=True)
        done = self.sites.wait_state("a", a["id"], ("COMPLETED", "FAILED"))
        self.assertEqual(done["state"], "COMPLETED", done.get("error"))
        self.assertEqual(lh.tree_digest(os.path.join(run, "step-1")), lh.tree_digest(self.dest("step-1")))
        # Once it has ended, a new run starts a new (empty) sync.
        third = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        self.assertNotEqual(third["id"], a["id"])


class KeepWithoutOnlyCompleteTest(lh.SitesTestCase):
    """`sync --keep` without `--only-complete`: a checkpoint counts once it
    holds a commit marker (.metadata, *.index.json, COMPLETE, --commit-last)."""

    def dest(self, *parts):
        return os.path.join(self.sites.export("site-b"), "run1", *parts)

    def sync(self, run_dir, *flags, check=True):
        return self.sites.cli("a", "sync", run_dir, "site-b:/ckpt/run1", "--wait", "--json", *flags,
                              check=check)

    def test_a_half_written_newest_checkpoint_is_not_sent_and_the_complete_one_stays(self):
        run = self.sites.path("run1")
        make_dcp_checkpoint(run, "step-100", seed=1)
        self.sync(run, "--keep", "1")
        self.assertEqual(os.listdir(self.dest()), ["step-100"])
        complete = lh.tree_digest(os.path.join(run, "step-100"))

        make_dcp_checkpoint(run, "step-200", seed=2, shards_written=2)  # 2 of 4, no .metadata
        second = self.sync(run, "--keep", "1")
        self.assertIn("skipping step-200", second.stderr)
        self.assertEqual(os.listdir(self.dest()), ["step-100"])
        self.assertEqual(lh.tree_digest(self.dest("step-100")), complete)

        make_dcp_checkpoint(run, "step-200", seed=2)  # now finished
        self.sync(run, "--keep", "1")
        self.assertEqual(os.listdir(self.dest()), ["step-200"])
        self.assertEqual(lh.tree_digest(self.dest("step-200")),
                         lh.tree_digest(os.path.join(run, "step-200")))

    def test_a_commit_last_glob_names_the_marker(self):
        run = self.sites.path("run1")
        make_checkpoint(run, "a-1", seed=1, marker="DONE")
        make_checkpoint(run, "a-2", seed=2, marker="DONE")
        make_checkpoint(run, "a-3", seed=3, complete=False)
        proc = self.sync(run, "--keep", "1", "--commit-last", "DON?")
        self.assertIn("skipping a-3", proc.stderr)
        self.assertEqual(os.listdir(self.dest()), ["a-2"])
        self.assertEqual(lh.tree_digest(self.dest("a-2")), lh.tree_digest(os.path.join(run, "a-2")))

    def test_an_unfinished_directory_at_the_destination_does_not_push_out_a_complete_one(self):
        run = self.sites.path("run1")
        make_dcp_checkpoint(run, "step-1", seed=1)
        # Something newer by name, without a marker, already at the destination.
        lh.write_random(self.dest("step-5", "__0_0.distcp"), 4096, seed=5)
        self.sync(run, "--keep", "1")
        self.assertEqual(sorted(os.listdir(self.dest())), ["step-1", "step-5"])
        self.assertEqual(lh.tree_digest(self.dest("step-1")), lh.tree_digest(os.path.join(run, "step-1")))

    def test_keep_without_any_marker_is_a_usage_error_that_says_what_to_add(self):
        run = self.sites.path("run1")
        make_checkpoint(run, "step-1", seed=1, complete=False)
        make_checkpoint(run, "step-2", seed=2, complete=False)
        proc = self.sync(run, "--keep", "1", check=False)
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("--only-complete", proc.stderr)
        self.assertIn("--commit-last", proc.stderr)
        self.assertFalse(os.path.exists(self.dest()))


class ChecksumSyncTest(lh.SitesTestCase):

    def sync(self, *flags):
        proc = self.sites.cli("a", "sync", self.src, "site-b:/ckpt/s", "--wait", "--json", *flags,
                              check=True)
        return json.loads(proc.stdout)

    def test_checksum_repairs_a_destination_file_changed_with_the_same_size_and_mtime(self):
        self.src = self.sites.path("src")
        lh.write_random(os.path.join(self.src, "a.bin"), 3 * MIB, seed=1)
        lh.write_random(os.path.join(self.src, "sub", "b.bin"), MIB, seed=2)
        first = self.sync()
        self.assertEqual(first["state"], "COMPLETED")
        dest = os.path.join(self.sites.export("site-b"), "s")
        expected = lh.tree_digest(self.src)
        self.assertEqual(lh.tree_digest(dest), expected)

        # Bit rot (or a stray writer) at the destination: one byte differs,
        # size and mtime are as before.
        damaged = os.path.join(dest, "a.bin")
        st = os.stat(damaged)
        with open(damaged, "r+b") as f:
            f.seek(MIB + 7)
            byte = f.read(1)
            f.seek(MIB + 7)
            f.write(bytes([byte[0] ^ 0xFF]))
        os.utime(damaged, ns=(st.st_atime_ns, st.st_mtime_ns))
        self.assertNotEqual(lh.tree_digest(dest), expected)

        plain = self.sync()
        self.assertEqual((plain["state"], plain["files_unchanged"], plain["bytes_sent"]),
                         ("COMPLETED", 2, 0))
        self.assertNotEqual(lh.tree_digest(dest), expected)

        checked = self.sync("--checksum")
        self.assertEqual(checked["state"], "COMPLETED", checked.get("error"))
        self.assertEqual(checked["files_unchanged"], 1)  # sub/b.bin
        self.assertEqual(checked["bytes"], 3 * MIB)
        self.assertEqual(lh.tree_digest(dest), expected)

        again = self.sync("--checksum")
        self.assertEqual((again["files_unchanged"], again["bytes_sent"]), (2, 0))


if __name__ == "__main__":
    unittest.main()
