"""Faithful trees: symlinks kept, followed or refused per transfer, and what
is not sent is listed in the result, the human output and `status`; sparse
files keep their holes; hard links stay hard links with --hard-links."""

import json
import os
import shutil
import tempfile

import lh


def finish_after_rewrite(test, tid):
    """Lifts site-b's rate cap once a source was rewritten mid-transfer, and
    asserts the transfer was still under way then and completes."""
    mid = test.sites.status("a", tid)
    test.assertNotIn(mid["state"], ("PUBLISHING", "COMPLETED"),
                     "the transfer ended before the rewrite; slow the link more")
    test.sites.cli("a", "limit", "--peer", "site-b", "off", check=True)
    done = test.sites.wait_state("a", tid, {"COMPLETED", "FAILED"}, timeout=180)
    test.assertEqual(done["state"], "COMPLETED", done.get("error"))


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


def holes_supported(directory):
    """Whether the file system of `directory` keeps holes (st_blocks)."""
    probe = os.path.join(directory, ".hole-probe")
    with open(probe, "wb") as f:
        f.truncate(16 << 20)
    blocks = os.stat(probe).st_blocks
    os.unlink(probe)
    return blocks * 512 < (1 << 20)


class SparseFileTest(lh.SitesTestCase):

    def write_sparse(self, path, size, pieces):
        """A file of `size` bytes holding random `pieces` [(offset, length)], holes elsewhere."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.truncate(size)
            for offset, length in pieces:
                f.seek(offset)
                f.write(os.urandom(length))

    def test_a_sparse_file_is_sent_as_its_data_and_arrives_with_its_holes(self):
        src = self.sites.path("src")
        os.makedirs(src)
        for d in (src, self.sites.export("site-b")):
            if not holes_supported(d):
                self.skipTest(f"the file system of {d} keeps no holes")
        MIB = 1 << 20
        size = 256 * MIB
        # 1 MiB of data: half a chunk in chunk 3, a chunk's worth across
        # chunks 100/101, and the file's last bytes.
        self.write_sparse(os.path.join(src, "disk.img"), size,
                          [(3 * MIB, 256 << 10), (100 * MIB + (3 * MIB) // 4, MIB // 2),
                           (size - (256 << 10), 256 << 10)])
        lh.write_random(os.path.join(src, "dense.bin"), MIB, seed=5)
        proc, result = self.sites.cp(src, "site-b:/ckpt/sparse", "--chunk-size", "1MiB")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(result["state"], "COMPLETED")
        # Chunks 3, 100, 101 and 255 of disk.img, and dense.bin: 5 MiB, not 257.
        self.assertLessEqual(result["bytes_sent"], 5.5 * MIB)
        self.assertLessEqual(result["bytes"], 5 * MIB)
        dest = os.path.join(self.sites.export("site-b"), "sparse")
        self.assertEqual(lh.tree_digest(src), lh.tree_digest(dest))
        st = os.stat(os.path.join(dest, "disk.img"))
        self.assertEqual(st.st_size, size)
        self.assertLess(st.st_blocks * 512, 8 * MIB, "the holes were filled in")
        verify = self.sites.cli("a", "verify", result["id"], "--json")
        self.assertEqual(verify.returncode, 0, verify.stdout + verify.stderr)
        self.assertTrue(json.loads(verify.stdout)["ok"])
        # sync finds it unchanged; after data lands in a hole, it is sent again.
        again = json.loads(self.sites.cli("a", "sync", src, "site-b:/ckpt/sparse", "--wait",
                                          "--json", "--chunk-size", "1MiB", check=True).stdout)
        self.assertEqual(again["bytes_sent"], 0)
        with open(os.path.join(src, "disk.img"), "r+b") as f:
            f.seek(200 * MIB)
            f.write(b"now data")
        third = json.loads(self.sites.cli("a", "sync", src, "site-b:/ckpt/sparse", "--wait",
                                          "--json", "--chunk-size", "1MiB", check=True).stdout)
        self.assertEqual(third["state"], "COMPLETED")
        self.assertEqual(lh.tree_digest(src), lh.tree_digest(dest))
        self.assertLessEqual(third["bytes_sent"], 6 * MIB)


    def test_data_written_into_a_hole_mid_transfer_arrives(self):
        # The manifest said "hole" at 200 MiB; the writer puts data there
        # while the transfer runs. The change is detected (mtime, ctime), the
        # extents are found again, and the new data is sent: the
        # destination never keeps a stale hole.
        src = self.sites.path("src")
        os.makedirs(src)
        for d in (src, self.sites.export("site-b")):
            if not holes_supported(d):
                self.skipTest(f"the file system of {d} keeps no holes")
        MIB = 1 << 20
        path = os.path.join(src, "disk.img")
        self.write_sparse(path, 256 * MIB, [(0, 16 * MIB)])
        self.sites.cli("a", "limit", "--peer", "site-b", "40Mbit", check=True)
        tid = self.sites.cli("a", "cp", src, "site-b:/ckpt/moving", "--chunk-size", "1MiB",
                             "--streams", "2", check=True).stdout.strip()
        lh.wait_until(lambda: self.sites.status("a", tid)["bytes_done"] >= 4 * MIB, 120,
                      "progress before the rewrite")
        with open(path, "r+b") as f:
            f.seek(200 * MIB)
            f.write(os.urandom(2 * MIB))
        finish_after_rewrite(self, tid)
        dest = os.path.join(self.sites.export("site-b"), "moving")
        self.assertEqual(lh.tree_digest(src), lh.tree_digest(dest))
        self.assertLess(os.stat(os.path.join(dest, "disk.img")).st_blocks * 512, 64 * MIB)

class HardLinkTest(lh.SitesTestCase):
    """--hard-links: names of one file inside the sources arrive as hard links
    of one file, and its bytes are sent once."""

    SIZE = 3 << 20

    def setUp(self):
        super().setUp()
        # src/
        #   weights.bin            \
        #   sub/weights-a.bin       } one file, three names
        #   sub/weights-b.bin      /
        #   other.bin              an ordinary file
        self.src = self.sites.path("src")
        self.names = ["weights.bin", "sub/weights-a.bin", "sub/weights-b.bin"]
        lh.write_random(os.path.join(self.src, self.names[0]), self.SIZE, seed=11)
        for name in self.names[1:]:
            os.makedirs(os.path.dirname(os.path.join(self.src, name)), exist_ok=True)
            os.link(os.path.join(self.src, self.names[0]), os.path.join(self.src, name))
        lh.write_random(os.path.join(self.src, "other.bin"), 100_000, seed=12)
        self.dest = os.path.join(self.sites.export("site-b"), "linked")

    def inodes(self, root, names):
        return {os.stat(os.path.join(root, n)).st_ino for n in names}

    def assertOneFile(self, root, names):
        self.assertEqual(len(self.inodes(root, names)), 1, f"{names} are not one file")
        self.assertGreaterEqual(os.stat(os.path.join(root, names[0])).st_nlink, len(names))

    def test_a_group_arrives_as_one_file_sent_once(self):
        proc, result = self.sites.cp(self.src, "site-b:/ckpt/linked", "--hard-links")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(result["state"], "COMPLETED", result.get("error"))
        self.assertEqual(lh.tree_digest(self.src), lh.tree_digest(self.dest))
        self.assertOneFile(self.dest, self.names)
        self.assertEqual(os.stat(os.path.join(self.dest, "other.bin")).st_nlink, 1)
        # One copy of the group and other.bin, not three.
        self.assertLess(result["bytes_sent"], 1.5 * self.SIZE)
        verify = self.sites.cli("a", "verify", result["id"], "--json")
        self.assertEqual(verify.returncode, 0, verify.stdout + verify.stderr)

    def test_without_the_option_each_name_is_a_file_of_its_own(self):
        proc, result = self.sites.cp(self.src, "site-b:/ckpt/linked")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(result["state"], "COMPLETED", result.get("error"))
        self.assertEqual(lh.tree_digest(self.src), lh.tree_digest(self.dest))
        self.assertEqual(len(self.inodes(self.dest, self.names)), 3)
        self.assertGreaterEqual(result["bytes_sent"], 3 * self.SIZE)

    def test_names_outside_the_tree_play_no_part(self):
        outside = self.sites.path("outside.bin")
        os.link(os.path.join(self.src, self.names[0]), outside)
        proc, result = self.sites.cp(os.path.join(self.src, "sub"), "site-b:/ckpt/linked",
                                     "--hard-links")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(result["state"], "COMPLETED", result.get("error"))
        inside = ["weights-a.bin", "weights-b.bin"]
        self.assertOneFile(self.dest, inside)
        self.assertEqual(os.stat(os.path.join(self.dest, inside[0])).st_nlink, 2)
        self.assertEqual(lh.tree_digest(os.path.join(self.src, "sub")), lh.tree_digest(self.dest))
        self.assertLess(result["bytes_sent"], 1.5 * self.SIZE)

    def sync(self):
        proc = self.sites.cli("a", "sync", self.src, "site-b:/ckpt/linked", "--hard-links",
                              "--wait", "--json")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        result = json.loads(proc.stdout)
        self.assertEqual(result["state"], "COMPLETED", result.get("error"))
        self.assertEqual(lh.tree_digest(self.src), lh.tree_digest(self.dest))
        self.assertOneFile(self.dest, self.names)
        return result

    def test_sync_keeps_the_group_and_sends_a_change_once(self):
        first = self.sync()
        self.assertLess(first["bytes_sent"], 1.5 * self.SIZE)
        again = self.sync()
        self.assertEqual(again["bytes_sent"], 0)
        # other.bin and the group's first name; its links are made again.
        self.assertEqual(again["files_unchanged"], 2)
        # Rewritten through one name: every name shows the new content.
        lh.rewrite_in_place(os.path.join(self.src, "sub/weights-b.bin"), self.SIZE, seed=13)
        changed = self.sync()
        self.assertGreater(changed["bytes_sent"], 0)
        self.assertLess(changed["bytes_sent"], 1.5 * self.SIZE)
        with open(os.path.join(self.src, "sub/weights-b.bin"), "rb") as f:
            new = f.read()
        for name in self.names:
            with open(os.path.join(self.dest, name), "rb") as f:
                self.assertEqual(f.read(), new, name)

    def test_a_group_rewritten_mid_transfer_arrives_whole_and_linked(self):
        # The first name is re-read under a new generation; its links are
        # stat'ed again with it (a link must keep its target's size), so the
        # receiver takes the new manifest and every name shows the new
        # content.
        MIB = 1 << 20
        big = 24 * MIB
        for name in self.names:
            os.unlink(os.path.join(self.src, name))
        lh.write_random(os.path.join(self.src, self.names[0]), big, seed=21)
        for name in self.names[1:]:
            os.link(os.path.join(self.src, self.names[0]), os.path.join(self.src, name))
        self.sites.cli("a", "limit", "--peer", "site-b", "40Mbit", check=True)
        tid = self.sites.cli("a", "cp", self.src, "site-b:/ckpt/linked", "--hard-links",
                             "--chunk-size", "1MiB", "--streams", "2", check=True).stdout.strip()
        lh.wait_until(lambda: self.sites.status("a", tid)["bytes_done"] >= 4 * MIB, 120,
                      "progress before the rewrite")
        # Grown through another name: the links' size must follow.
        with open(os.path.join(self.src, "sub/weights-b.bin"), "r+b") as f:
            f.seek(0, os.SEEK_END)
            f.write(os.urandom(MIB))
        finish_after_rewrite(self, tid)
        self.assertIn("source file changed since its manifest", self.sites.log("site-a"))
        self.assertEqual(lh.tree_digest(self.src), lh.tree_digest(self.dest))
        self.assertOneFile(self.dest, self.names)


if __name__ == "__main__":
    import unittest
    unittest.main()
