"""Transfers between two local daemons: trees, sync, control verbs, exit codes."""

import json
import os
import subprocess
import time
import unittest

import lh

MIB = 1 << 20


def make_mixed_tree(root):
    """0 bytes, 1 byte, one chunk +-1, several chunks; nested dirs; modes; mtimes."""
    files = {
        "empty": 0,
        "one": 1,
        "chunk_minus_1": MIB - 1,
        "chunk": MIB,
        "a/chunk_plus_1": MIB + 1,
        "a/b/c/several": 3 * MIB + 7,
        "a/b/small.txt": 100,
        ".metadata": 4096,
        "model.index.json": 300,
    }
    for i, (rel, size) in enumerate(sorted(files.items())):
        lh.write_random(os.path.join(root, rel), size, seed=i)
    os.chmod(os.path.join(root, "one"), 0o600)
    os.chmod(os.path.join(root, "a/b/c/several"), 0o750)
    os.utime(os.path.join(root, "chunk"), ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
    os.makedirs(os.path.join(root, "empty_dir/inner"))
    return files


class TransferTest(lh.SitesTestCase):

    def test_tree_of_mixed_sizes_arrives_identical_with_modes_and_mtimes(self):
        src = self.sites.path("src")
        make_mixed_tree(src)
        proc, result = self.sites.cp(src, "site-b:/ckpt/run1/step1", "--chunk-size", "1MiB",
                                     "--streams", "4")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(result["state"], "COMPLETED")
        self.assertEqual(result["files"], 9)
        self.assertEqual(result["resent_bytes"], 0)
        dest = os.path.join(self.sites.export("site-b"), "run1/step1")
        self.assertEqual(lh.tree_digest(src), lh.tree_digest(dest))
        self.assertEqual(lh.empty_dirs(src), lh.empty_dirs(dest))
        verify = self.sites.cli("a", "verify", result["id"], "--json")
        self.assertEqual(verify.returncode, 0, verify.stdout + verify.stderr)
        self.assertTrue(json.loads(verify.stdout)["ok"])
        # Staging is gone after publish.
        staging = os.path.join(self.sites.export("site-b"), ".longhaul/staging")
        self.assertEqual(os.listdir(staging) if os.path.isdir(staging) else [], [])

    def test_single_file_lands_under_the_given_name(self):
        src = self.sites.path("model.bin")
        lh.write_random(src, 5 * MIB + 3, seed=7)
        proc, result = self.sites.cp(src, "site-b:/ckpt/models/model-v2.bin", "--chunk-size", "1MiB")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        dest = os.path.join(self.sites.export("site-b"), "models/model-v2.bin")
        with open(src, "rb") as a, open(dest, "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_sync_twice_sends_nothing_the_second_time(self):
        src = self.sites.path("src")
        make_mixed_tree(src)
        first = self.sites.cli("a", "sync", src, "site-b:/ckpt/mirror", "--wait", "--json",
                               "--chunk-size", "1MiB")
        self.assertEqual(first.returncode, 0, first.stderr)
        self.assertGreater(json.loads(first.stdout)["bytes_sent"], 0)
        second = self.sites.cli("a", "sync", src, "site-b:/ckpt/mirror", "--wait", "--json",
                                "--chunk-size", "1MiB")
        self.assertEqual(second.returncode, 0, second.stderr)
        again = json.loads(second.stdout)
        self.assertEqual(again["state"], "COMPLETED")
        self.assertEqual(again["bytes_sent"], 0)
        self.assertEqual(again["files_unchanged"], again["files"])
        # A changed file is the only thing a third sync sends.
        lh.write_random(os.path.join(src, "a/b/small.txt"), 200, seed=99)
        third = json.loads(self.sites.cli("a", "sync", src, "site-b:/ckpt/mirror", "--wait",
                                          "--json", "--chunk-size", "1MiB", check=True).stdout)
        self.assertEqual(third["bytes_sent"], 200)
        self.assertEqual(lh.tree_digest(src),
                         lh.tree_digest(os.path.join(self.sites.export("site-b"), "mirror")))

    def test_submit_is_idempotent_by_request_id(self):
        src = self.sites.path("f")
        lh.write_random(src, 1000, seed=1)
        ids = {self.sites.cli("a", "cp", src, "site-b:/ckpt/f", "--request-id", "job-42",
                              check=True).stdout.strip() for _ in range(3)}
        self.assertEqual(len(ids), 1)

    def test_pause_resume_and_cancel(self):
        src = self.sites.path("big")
        lh.write_random(src, 256 * MIB, seed=3)
        tid = self.sites.cli("a", "cp", src, "site-b:/ckpt/big", "--chunk-size", "4MiB",
                             "--streams", "2", check=True).stdout.strip()
        paused = json.loads(self.sites.cli("a", "pause", tid, "--json", check=True).stdout)
        self.assertIn(paused["state"], ("PAUSED", "COMPLETED"))
        if paused["state"] == "PAUSED":
            time.sleep(0.5)
            self.assertEqual(self.sites.status("a", tid)["bytes_done"], paused["bytes_done"])
            self.sites.cli("a", "resume", tid, check=True)
        done = self.sites.wait_state("a", tid, {"COMPLETED", "FAILED"})
        self.assertEqual(done["state"], "COMPLETED")
        with open(src, "rb") as a, open(os.path.join(self.sites.export("site-b"), "big"), "rb") as b:
            self.assertEqual(a.read(), b.read())

        tid2 = self.sites.cli("a", "cp", src, "site-b:/ckpt/big2", "--chunk-size", "4MiB",
                              "--streams", "2", check=True).stdout.strip()
        cancelled = json.loads(self.sites.cli("a", "cancel", tid2, "--json", check=True).stdout)
        self.assertEqual(cancelled["state"], "CANCELLED")
        self.assertFalse(os.path.exists(os.path.join(self.sites.export("site-b"), "big2")))
        staging = os.path.join(self.sites.export("site-b"), ".longhaul/staging", tid2)
        deadline = time.time() + 10
        while os.path.exists(staging) and time.time() < deadline:
            time.sleep(0.1)
        self.assertFalse(os.path.exists(staging), "cancel must remove the staging directory")


class ExitCodeTest(unittest.TestCase):

    def run_cli(self, *args):
        return subprocess.run([os.path.join(lh.BIN, "longhaul"), *args], capture_output=True, text=True)

    def test_unreachable_daemon_exits_3(self):
        proc = self.run_cli("--daemon", "unix:/nonexistent/longhaul.sock", "ls")
        self.assertEqual(proc.returncode, 3)
        self.assertIn("cannot reach longhauld", proc.stderr)

    def test_usage_error_exits_2(self):
        self.assertEqual(self.run_cli("cp", "onlyone").returncode, 2)
        self.assertEqual(self.run_cli("frobnicate").returncode, 2)
        proc = self.run_cli("--daemon", "unix:/x", "cp", "/etc/hostname", "not-a-destination")
        self.assertEqual(proc.returncode, 2)
        self.assertIn("SITE:/EXPORT/PATH", proc.stderr)


if __name__ == "__main__":
    unittest.main()
