"""Faithful trees: symlinks kept, followed or refused per transfer, and what
is not sent is listed in the result, the human output and `status`."""

import json
import os
import shutil
import tempfile

import lh


class SymlinkTest(lh.SitesTestCase):

    def setUp(self):
        super().setUp()
        # src/
        #   model/shard-0.safetensors
        #   latest -> model/shard-0.safetensors   (relative, in the tree)
        #   model/up -> ../latest                 (relative, in the tree)
        #   escape -> ../outside.bin              (relative, leaves the tree)
        #   absolute -> <abs path of outside.bin> (absolute)
        self.src = self.sites.path("src")
        lh.write_random(os.path.join(self.src, "model/shard-0.safetensors"), 300_000, seed=1)
        self.outside = self.sites.path("outside.bin")
        lh.write_random(self.outside, 5000, seed=2)
        os.symlink("model/shard-0.safetensors", os.path.join(self.src, "latest"))
        os.symlink("../latest", os.path.join(self.src, "model/up"))
        os.symlink("../outside.bin", os.path.join(self.src, "escape"))
        os.symlink(self.outside, os.path.join(self.src, "absolute"))
        self.dest = os.path.join(self.sites.export("site-b"), "run/step")

    def skipped(self, result):
        return {e["path"]: e["why"] for e in result["skipped"]}

    def test_keep_sends_in_tree_links_as_links_and_lists_the_others(self):
        proc, result = self.sites.cp(self.src, "site-b:/ckpt/run/step")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(result["state"], "COMPLETED")
        self.assertEqual(os.readlink(os.path.join(self.dest, "latest")),
                         "model/shard-0.safetensors")
        self.assertEqual(os.readlink(os.path.join(self.dest, "model/up")), "../latest")
        with open(os.path.join(self.dest, "latest"), "rb") as a, \
                open(os.path.join(self.src, "model/shard-0.safetensors"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        self.assertFalse(os.path.lexists(os.path.join(self.dest, "escape")))
        self.assertFalse(os.path.lexists(os.path.join(self.dest, "absolute")))
        skipped = self.skipped(result)
        self.assertEqual(sorted(skipped), ["absolute", "escape"])
        self.assertIn("absolute", skipped["absolute"])
        self.assertIn("outside the transferred tree", skipped["escape"])
        # `status` says it too, as JSON and for people.
        self.assertEqual(self.skipped(self.sites.status("a", result["id"])), skipped)
        human = self.sites.cli("a", "status", result["id"], check=True).stdout
        self.assertIn("skipped escape:", human)
        self.assertIn("skipped absolute:", human)

    def test_the_human_summary_lists_what_was_skipped(self):
        proc = self.sites.cli("a", "cp", self.src, "site-b:/ckpt/run/step", "--wait")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("2 skipped", proc.stdout)
        self.assertIn("skipped escape: symlink to \"../outside.bin\"", proc.stdout)

    def test_follow_sends_targets_inside_readable_exports_only(self):
        # One target outside every export, one that is the daemon's TLS key.
        elsewhere = tempfile.mkdtemp(prefix="lh-not-exported-")
        self.addCleanup(shutil.rmtree, elsewhere, True)
        with open(os.path.join(elsewhere, "secret"), "w") as f:
            f.write("not exported")
        os.symlink(os.path.join(elsewhere, "secret"), os.path.join(self.src, "unexported"))
        os.symlink(self.sites.path("pki", "site-a.key"), os.path.join(self.src, "key"))
        os.symlink("model", os.path.join(self.src, "model-dir"))
        proc, result = self.sites.cp(self.src, "site-b:/ckpt/run/step", "--symlinks", "follow")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(result["state"], "COMPLETED")
        for name in ("latest", "escape", "absolute", "model/up", "model-dir/shard-0.safetensors"):
            path = os.path.join(self.dest, name)
            self.assertFalse(os.path.islink(path), name)
            self.assertTrue(os.path.isfile(path), name)
        with open(os.path.join(self.dest, "escape"), "rb") as a, open(self.outside, "rb") as b:
            self.assertEqual(a.read(), b.read())
        skipped = self.skipped(result)
        self.assertEqual(sorted(skipped), ["key", "unexported"])
        self.assertIn("private key", skipped["key"])
        self.assertIn("outside this site's exports", skipped["unexported"])
        self.assertFalse(os.path.lexists(os.path.join(self.dest, "key")))
        self.assertFalse(os.path.lexists(os.path.join(self.dest, "unexported")))

    def test_refuse_fails_the_transfer_naming_the_link(self):
        proc, result = self.sites.cp(self.src, "site-b:/ckpt/run/step", "--symlinks", "refuse")
        self.assertNotEqual(proc.returncode, 0)
        message = proc.stderr + proc.stdout
        self.assertIn("is a symlink", message)
        self.assertIn("--symlinks", message)
        self.assertFalse(os.path.exists(self.dest))

    def test_a_symlink_loop_is_skipped_when_following(self):
        os.symlink("..", os.path.join(self.src, "model/parent"))
        proc, result = self.sites.cp(self.src, "site-b:/ckpt/run/step", "--symlinks", "follow")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("loop", self.skipped(result)["model/parent"])
        self.assertFalse(os.path.lexists(os.path.join(self.dest, "model/parent")))


if __name__ == "__main__":
    import unittest
    unittest.main()
