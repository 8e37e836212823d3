"""Nothing at a destination is replaced or deleted by surprise: cp refuses a
destination that holds something else (unless --replace), whatever a publish
replaces or deletes stays recoverable in the export's trash until
transfer.trash_retention has passed, every run reports what it replaced and
deleted, sync --no-delete keeps destination-only files, and --dry-run lists
all of it while changing nothing at either site."""

import json
import os
import shutil
import unittest

import lh

LAYOUT = {"a.bin": 4096, "sub/b.bin": 3000, ".metadata": 512}


class NoSurpriseCase(lh.SitesTestCase):

    def dest(self, *parts):
        return os.path.join(self.sites.export("site-b"), *parts)

    def version(self, version, layout=LAYOUT, name=None):
        src = self.sites.path(name or f"src-v{version}")
        lh.write_versioned_checkpoint(src, version, layout)
        return src

    def run_ok(self, command, src, rel, *extra):
        proc = self.sites.cli("a", command, src, f"site-b:/ckpt/{rel}", *extra, "--wait",
                              "--json")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        result = json.loads(proc.stdout)
        self.assertEqual(result["state"], "COMPLETED", result)
        return result

    def trash_version(self, report):
        """The path of the trash entry's `version` the report names."""
        self.assertTrue(report["trash"].startswith(".longhaul/trash/"), report)
        entry = os.path.join(self.sites.export("site-b"), report["trash"])
        return entry, os.path.join(entry, "version")


class CpRefusalTest(NoSurpriseCase):

    def test_cp_onto_another_tree_is_refused_before_submit(self):
        self.run_ok("cp", self.version(1), "ck")
        before = lh.tree_digest(self.dest("ck"))
        listed_before = [self.sites.cli(site, "ls", "--all", "--json", check=True).stdout
                         for site in ("a", "b")]
        proc = self.sites.cli("a", "cp", self.version(2), "site-b:/ckpt/ck", "--wait")
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        self.assertIn("exists and it holds another tree", proc.stderr)
        self.assertIn("cp --replace", proc.stderr)
        self.assertIn("sync", proc.stderr)
        self.assertEqual(lh.tree_digest(self.dest("ck")), before)
        # Refused before an id: neither site knows a transfer more.
        self.assertEqual([self.sites.cli(site, "ls", "--all", "--json", check=True).stdout
                          for site in ("a", "b")], listed_before)
        self.assertEqual(len(json.loads(listed_before[0])["transfers"]), 1)

    def test_cp_of_a_file_onto_another_file_is_refused(self):
        one, two = self.sites.path("one.bin"), self.sites.path("two.bin")
        lh.write_random(one, 5000, seed=1)
        lh.write_random(two, 5000, seed=2)
        self.run_ok("cp", one, "f.bin")
        proc = self.sites.cli("a", "cp", two, "site-b:/ckpt/f.bin")
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        self.assertIn("it holds another file", proc.stderr)
        with open(one, "rb") as a, open(self.dest("f.bin"), "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_the_same_cp_again_succeeds(self):
        src = self.version(1)
        self.run_ok("cp", src, "ck")
        again = self.run_ok("cp", src, "ck")
        self.assertTrue(again["report"]["replaced"], again)
        self.assertEqual(again["report"]["deleted"], [])


class TrashTest(NoSurpriseCase):

    def test_replaced_tree_is_restored_from_the_trash(self):
        self.run_ok("cp", self.version(1), "ck")
        old = lh.tree_digest(self.dest("ck"))
        result = self.run_ok("cp", self.version(2, {"a.bin": 4096, "new.bin": 100}), "ck",
                             "--replace")
        report = result["report"]
        self.assertTrue(report["replaced"], report)
        self.assertEqual(report["changed"], ["a.bin"])
        self.assertEqual(report["deleted"], [".metadata", "sub/b.bin"])
        entry, version = self.trash_version(report)
        with open(os.path.join(entry, "origin")) as f:
            self.assertEqual(f.read(), "ck\n")
        self.assertEqual(lh.tree_digest(version), old)
        # Restore, as README says: the current version aside, the old one back.
        os.rename(self.dest("ck"), self.sites.path("ck-v2"))
        os.rename(version, self.dest("ck"))
        self.assertEqual(lh.tree_digest(self.dest("ck")), old)

    def test_replaced_file_is_kept_in_the_trash(self):
        one, two = self.sites.path("one.bin"), self.sites.path("two.bin")
        lh.write_random(one, 5000, seed=1)
        lh.write_random(two, 6000, seed=2)
        self.run_ok("cp", one, "f.bin")
        report = self.run_ok("cp", two, "f.bin", "--replace")["report"]
        self.assertEqual(report["changed"], [""])
        _, version = self.trash_version(report)
        with open(one, "rb") as a, open(version, "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_human_output_reports_what_sync_replaced_and_deleted(self):
        src = self.version(1, name="src")
        self.run_ok("sync", src, "ck")
        os.remove(os.path.join(src, "sub", "b.bin"))
        lh.write_versioned_checkpoint(src, 2, {"a.bin": 4096})
        proc = self.sites.cli("a", "sync", src, "site-b:/ckpt/ck", "--wait")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("replaced the previous version: 1 files changed, 1 deleted; kept in "
                      ".longhaul/trash/", proc.stdout)
        self.assertIn("\n  changed a.bin", proc.stdout)
        self.assertIn("\n  deleted sub/b.bin", proc.stdout)
        self.assertFalse(os.path.exists(self.dest("ck", "sub", "b.bin")))


class PruneReportTest(NoSurpriseCase):

    def test_sync_keep_reports_the_checkpoints_it_pruned(self):
        run = self.sites.path("run")
        lh.write_versioned_checkpoint(os.path.join(run, "step-1"), 1, LAYOUT)
        args = ("sync", run, "site-b:/ckpt/run", "--keep", "1", "--only-complete", ".metadata",
                "--wait")
        self.assertEqual(self.sites.cli("a", *args).returncode, 0)
        lh.write_versioned_checkpoint(os.path.join(run, "step-2"), 2, LAYOUT)
        proc = self.sites.cli("a", *args)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("\n  pruned step-1", proc.stdout)
        self.assertEqual(sorted(os.listdir(self.dest("run"))), ["step-2"])


class TrashExpiryTest(NoSurpriseCase):
    extra_config = "transfer:\n  trash_retention: 1s\n"

    def test_trash_entry_is_removed_after_trash_retention(self):
        self.run_ok("cp", self.version(1), "ck")
        report = self.run_ok("cp", self.version(2), "ck", "--replace")["report"]
        entry, _ = self.trash_version(report)
        lh.wait_until(lambda: not os.path.exists(entry), 60,
                      f"site-b to remove {entry} after trash_retention")
        self.assertEqual(lh.tree_digest(self.dest("ck")),
                         lh.tree_digest(self.sites.path("src-v2")))


class NoDeleteTest(NoSurpriseCase):

    def test_sync_no_delete_keeps_destination_only_files(self):
        src = self.version(1, name="src")
        self.run_ok("sync", src, "ck")
        kept = lh.tree_digest(self.dest("ck"))["sub/b.bin"]
        shutil.rmtree(os.path.join(src, "sub"))
        lh.write_versioned_checkpoint(src, 2, {"a.bin": 4096})
        report = self.run_ok("sync", src, "ck", "--no-delete")["report"]
        self.assertEqual((report["deleted"], report["deleted_count"]), ([], 0), report)
        self.assertEqual(report["changed"], ["a.bin"])
        after = lh.tree_digest(self.dest("ck"))
        self.assertEqual(after["sub/b.bin"], kept)
        self.assertEqual(after["a.bin"], lh.tree_digest(src)["a.bin"])


class DryRunTest(NoSurpriseCase):

    def snapshot(self):
        """Both sites' trees (the destination's .longhaul included), their
        staging, and every transfer either journal knows."""
        state = {"src": lh.tree_digest(self.sites.path("src")),
                 "dest": lh.tree_digest(self.sites.export("site-b"))}
        for site in ("a", "b"):
            listed = self.sites.cli(site, "ls", "--all", "--json", check=True).stdout
            state[f"ls-{site}"] = [t["id"] for t in json.loads(listed)["transfers"]]
            staging = os.path.join(self.sites.export(f"site-{site}"), ".longhaul", "staging")
            state[f"staging-{site}"] = sorted(os.listdir(staging)) if os.path.isdir(staging) else []
        return state

    def test_sync_dry_run_lists_everything_and_changes_nothing(self):
        src = self.version(1, name="src")
        self.run_ok("sync", src, "ck")
        os.remove(os.path.join(src, "sub", "b.bin"))
        lh.write_versioned_checkpoint(src, 2, {"a.bin": 4096, "new.bin": 10})
        before = self.snapshot()
        proc = self.sites.cli("a", "sync", src, "site-b:/ckpt/ck", "--dry-run", "--json")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        result = json.loads(proc.stdout)
        self.assertTrue(result["dry_run"])
        self.assertEqual(result["would_send"], ["a.bin", "new.bin"])
        self.assertEqual(result["report"]["changed"], ["a.bin"])
        self.assertEqual(result["report"]["deleted"], ["sub/b.bin"])
        self.assertEqual(self.snapshot(), before)
        human = self.sites.cli("a", "sync", src, "site-b:/ckpt/ck", "--dry-run", check=True)
        self.assertIn("\n  send new.bin", human.stdout)
        self.assertIn("\n  delete sub/b.bin", human.stdout)
        self.assertEqual(self.snapshot(), before)

    def test_cp_dry_run_onto_another_tree_is_refused_as_cp_is(self):
        self.run_ok("cp", self.version(1, name="src"), "ck")
        other = self.version(2)
        before = self.snapshot()
        proc = self.sites.cli("a", "cp", other, "site-b:/ckpt/ck", "--dry-run")
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        self.assertIn("cp --replace", proc.stderr)
        listed = self.sites.cli("a", "cp", other, "site-b:/ckpt/ck", "--dry-run", "--replace",
                                "--json", check=True)
        self.assertEqual(json.loads(listed.stdout)["report"]["changed_count"], 3)
        self.assertEqual(self.snapshot(), before)


if __name__ == "__main__":
    unittest.main()
