"""A pull writes only where its caller could write (ctest label `security`).

The daemons run as root. site-b's export `ckpt` lists no writers, so site-a
may write there only as the source of a pull site-b issued; site-b's export
`local` (the test directory, which holds the sites' TLS keys) lists none
either. The CLI runs as root or, through setpriv, as the unprivileged user
nobody in the control socket's group. A pull a user may not write is refused
at submit (exit 2, naming the user and the path, before site-a is asked) and
again whenever site-a opens or commits it; the daemon's own secrets are
never pulled over, whoever asks.
"""

import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import lh  # noqa: E402

NOBODY_UID = 65534
NOBODY_GID = 65534
MIB = 1 << 20


def as_nobody(cmd):
    return ["setpriv", f"--reuid={NOBODY_UID}", f"--regid={NOBODY_GID}", "--clear-groups", "--", *cmd]


@unittest.skipUnless(os.geteuid() == 0, "needs root: the daemons run as root, the caller as nobody")
class PullCallerTest(lh.AccessTestCase):
    writers = "site-b="
    readers = "site-a=site-b"

    def setUp(self):
        super().setUp()
        # nobody reaches site-b's control socket through the socket's group.
        for d in (self.sites.dir, self.sites.path("site-b")):
            os.chmod(d, 0o755)
        sock = self.sites.path("site-b", "control.sock")
        os.chown(sock, 0, NOBODY_GID)
        os.chmod(sock, 0o660)
        self.export_b = self.sites.export("site-b")
        os.chmod(self.export_b, 0o755)
        self.payload = os.path.join(self.sites.export("site-a"), "payload.bin")
        lh.write_random(self.payload, 100_000, seed=1)

    def pull(self, src, dest, *extra, user="root", wait=True):
        cmd = [os.path.join(lh.BIN, "longhaul"), "--daemon", self.sites.env["LONGHAUL_SITE_B"],
               "cp", src, dest, "--json", *extra, *(["--wait"] if wait else [])]
        if user == "nobody":
            cmd = as_nobody(cmd)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        out = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
        return proc, out

    def assert_pulled(self, proc, out, dest):
        self.assertEqual((proc.returncode, out.get("state")), (0, "COMPLETED"),
                         proc.stderr + proc.stdout)
        with open(self.payload, "rb") as a, open(dest, "rb") as b:
            self.assertEqual(a.read(), b.read())

    def assert_refused_at_submit(self, proc, *needles):
        self.assertEqual(proc.returncode, 2, f"stdout: {proc.stdout}\nstderr: {proc.stderr}")
        for needle in needles:
            self.assertIn(needle, proc.stderr)
        # Refused before site-a was asked: no transfer at either site.
        for site in ("a", "b"):
            listed = json.loads(self.sites.cli(site, "ls", "--all", "--json", check=True).stdout)
            self.assertEqual(listed["transfers"], [], f"site-{site} holds a transfer")

    def root_file(self, path, content):
        with open(path, "wb") as f:
            f.write(content)
        os.chmod(path, 0o644)
        return path

    def content(self, path):
        with open(path, "rb") as f:
            return f.read()

    def test_nobody_cannot_pull_over_a_root_file_in_an_export_without_writers(self):
        target = self.root_file(os.path.join(self.export_b, "model.bin"), b"root's model")
        proc, _ = self.pull("site-a:/ckpt/payload.bin", "site-b:/ckpt/model.bin", user="nobody")
        self.assert_refused_at_submit(
            proc, f"uid {NOBODY_UID} (nobody) may not write {target}",
            f"no write permission on directory {self.export_b} (owner root, group root, mode 0755)")
        self.assertEqual(self.content(target), b"root's model")
        # Nor a new file beside it, nor a directory tree.
        for dest in ("site-b:/ckpt/new.bin", "site-b:/ckpt/run/step-1"):
            proc, _ = self.pull("site-a:/ckpt/payload.bin", dest, user="nobody")
            self.assert_refused_at_submit(proc, f"uid {NOBODY_UID} (nobody) may not write")
        self.assertEqual(sorted(n for n in os.listdir(self.export_b) if n != ".longhaul"),
                         ["model.bin"])
        self.assertIn(f"control call Submit from uid {NOBODY_UID} (nobody) refused",
                      self.sites.log("site-b"))

    def test_the_site_key_inside_an_export_is_never_pulled_over(self):
        key = self.sites.path("pki", "site-b.key")
        before = self.content(key)
        for user in ("nobody", "root"):
            proc, _ = self.pull("site-a:/ckpt/payload.bin", "site-b:/local/pki/site-b.key", user=user)
            self.assert_refused_at_submit(proc, key)
            self.assertEqual(self.content(key), before, f"{user} replaced the site's key")
        # Nor the directory that holds it.
        proc, _ = self.pull("site-a:/ckpt/payload.bin", "site-b:/local/pki")
        self.assert_refused_at_submit(proc, "holds this site's TLS private key")
        self.assertEqual(self.content(key), before)

    def test_nobody_pulls_where_it_may_write_and_root_everywhere(self):
        own = os.path.join(self.export_b, "nobody")
        os.mkdir(own)
        os.chown(own, NOBODY_UID, NOBODY_GID)
        proc, out = self.pull("site-a:/ckpt/payload.bin", "site-b:/ckpt/nobody/model.bin",
                              user="nobody")
        self.assert_pulled(proc, out, os.path.join(own, "model.bin"))
        # Again over what it pulled (published as the daemon's), and a tree.
        proc, out = self.pull("site-a:/ckpt/payload.bin", "site-b:/ckpt/nobody/model.bin",
                              user="nobody")
        self.assert_pulled(proc, out, os.path.join(own, "model.bin"))
        tree = os.path.join(self.sites.export("site-a"), "tree")
        os.mkdir(tree)
        lh.write_random(os.path.join(tree, "shard.bin"), 50_000, seed=2)
        proc, out = self.pull("site-a:/ckpt/tree", "site-b:/ckpt/nobody/run/tree", user="nobody")
        self.assertEqual((proc.returncode, out.get("state")), (0, "COMPLETED"), proc.stderr)
        self.assertEqual(lh.tree_digest(tree), lh.tree_digest(os.path.join(own, "run", "tree")))
        # Root, the daemon's own user, still pulls over root's files.
        target = self.root_file(os.path.join(self.export_b, "model.bin"), b"root's model")
        proc, out = self.pull("site-a:/ckpt/payload.bin", "site-b:/ckpt/model.bin", "--replace")
        self.assert_pulled(proc, out, target)

    def test_a_running_pull_stops_when_its_caller_may_no_longer_write(self):
        own = os.path.join(self.export_b, "nobody")
        os.mkdir(own)
        os.chown(own, NOBODY_UID, NOBODY_GID)
        big = os.path.join(self.sites.export("site-a"), "big")
        lh.write_random(os.path.join(big, "shard.bin"), 64 * MIB, seed=3)
        self.sites.cli("a", "limit", "--peer", "site-b", "50Mbit", check=True)
        proc, out = self.pull("site-a:/ckpt/big", "site-b:/ckpt/nobody/big", user="nobody",
                              wait=False)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        tid = out["id"]
        self.sites.wait_state("a", tid, {"RUNNING"})
        self.sites.cli("a", "pause", tid, check=True)
        self.sites.wait_state("a", tid, {"PAUSED"})
        # The directory is root's now: nobody may not write there any more.
        os.chown(own, 0, 0)
        self.sites.cli("a", "limit", "--peer", "site-b", "off", check=True)
        self.sites.cli("a", "resume", tid, check=True)
        ended = self.sites.wait_state("a", tid, {"FAILED", "COMPLETED", "CANCELLED"})
        self.assertEqual(ended["state"], "FAILED", ended)
        # The source reads site-b's refusal with the export's name, not site-b's path.
        self.assertIn(f"uid {NOBODY_UID} (nobody) may not write ckpt:nobody/big", ended["error"])
        self.assertNotIn(own, ended["error"])
        self.assertEqual(os.listdir(own), [])
        self.assertIn("may not write there", self.sites.log("site-b"))


if __name__ == "__main__":
    unittest.main()
