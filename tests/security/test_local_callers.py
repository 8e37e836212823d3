"""Hostile local callers (ctest label `security`): the daemon runs as root; the
CLI runs as root or, through setpriv, as the unprivileged user nobody.

Each refusal exits 2, names what to fix, is logged with the caller's uid or
token role, and writes nothing at the destination. Sources must lie inside
one of the site's exports after resolving symlinks, and a local caller sends
only what that user could read itself. On the TCP control address a viewer
token only reads.
"""

import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest

import sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import lh  # noqa: E402

NOBODY_UID = 65534
NOBODY_GID = 65534


def as_nobody(cmd):
    return ["setpriv", f"--reuid={NOBODY_UID}", f"--regid={NOBODY_GID}", "--clear-groups", "--", *cmd]


@unittest.skipUnless(os.geteuid() == 0, "needs root: the daemon runs as root, the caller as nobody")
class LocalCallerTest(lh.SitesTestCase):

    def setUp(self):
        super().setUp()
        # nobody must reach the control socket for the daemon to be the one
        # that refuses (a real site grants this with the socket's group).
        for d in (self.sites.dir, self.sites.path("site-a")):
            os.chmod(d, 0o755)
        os.chmod(self.sites.path("site-a", "control.sock"), 0o666)
        self.daemon = self.sites.env["LONGHAUL_SITE_A"]
        self.export_a = self.sites.export("site-a")
        os.chmod(self.export_a, 0o755)
        self.outside = tempfile.mkdtemp(prefix="lh-outside-")
        self.addCleanup(shutil.rmtree, self.outside, True)
        os.chmod(self.outside, 0o755)
        probe = subprocess.run(as_nobody([os.path.join(lh.BIN, "longhaul"), "--help"]),
                               capture_output=True, text=True)
        self.assertEqual(probe.returncode, 0, f"nobody cannot run the CLI: {probe.stderr}")

    def cp(self, *args, user="root"):
        cmd = [os.path.join(lh.BIN, "longhaul"), "--daemon", self.daemon, "cp", *args, "--wait", "--json"]
        if user == "nobody":
            cmd = as_nobody(cmd)
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    def write(self, path, size, seed, mode=0o644):
        lh.write_random(path, size, seed)
        os.chmod(path, mode)
        return path

    def dest_names(self):
        export = self.sites.export("site-b")
        return sorted(n for n in os.listdir(export) if n != ".longhaul")

    def assert_refused(self, proc, *needles):
        self.assertEqual(proc.returncode, 2, f"stdout: {proc.stdout}\nstderr: {proc.stderr}")
        for needle in needles:
            self.assertIn(needle, proc.stderr)
        self.assertEqual(self.dest_names(), [])
        listed = json.loads(self.sites.cli("a", "ls", "--all", "--json", check=True).stdout)
        self.assertEqual(listed["transfers"], [], "a refused source must not become a transfer")

    def assert_exports_named(self, proc):
        self.assertIn(f"ckpt: {self.export_a}", proc.stderr)

    def test_shadow_is_refused_for_nobody(self):
        proc = self.cp("/etc/shadow", "site-b:/ckpt/loot", user="nobody")
        self.assert_refused(proc, "/etc/shadow")
        self.assert_exports_named(proc)
        self.assertIn(f"uid {NOBODY_UID} (nobody)", self.sites.log("site-a"))

    def test_file_outside_every_export_is_refused_for_root_too(self):
        src = self.write(os.path.join(self.outside, "model.bin"), 4096, seed=1)
        proc = self.cp(src, "site-b:/ckpt/model.bin")
        self.assert_refused(proc, src, "outside this site's exports")
        self.assert_exports_named(proc)
        self.assertIn("uid 0 (root)", self.sites.log("site-a"))

    def test_the_site_key_is_refused_for_root(self):
        key = self.sites.path("pki", "site-a.key")
        proc = self.cp(key, "site-b:/ckpt/loot.key")
        self.assert_refused(proc, key)

    def test_the_pki_directory_is_refused_for_root(self):
        # deploy/local-sites.sh's `local` export is the whole test directory,
        # PKI included: the CA's key and the other sites' keys stay home.
        for src in (self.sites.path("pki", "ca.key"), self.sites.path("pki", "site-b.key"),
                    self.sites.path("pki")):
            proc = self.cp(src, "site-b:/ckpt/loot")
            self.assert_refused(proc, src, "this site's PKI directory")

    def test_symlink_inside_an_export_pointing_outside_is_refused(self):
        target = self.write(os.path.join(self.outside, "public.bin"), 4096, seed=2)
        os.makedirs(os.path.join(self.outside, "dir"))
        self.write(os.path.join(self.outside, "dir", "x.bin"), 4096, seed=3)
        link = os.path.join(self.export_a, "link.bin")
        os.symlink(target, link)
        dir_link = os.path.join(self.export_a, "linkdir")
        os.symlink(os.path.join(self.outside, "dir"), dir_link)
        for user in ("root", "nobody"):
            for src in (link, dir_link):
                proc = self.cp(src, "site-b:/ckpt/leak", user=user)
                self.assert_refused(proc, src, "outside this site's exports")
        # Inside a source directory a symlink is skipped, whoever asks.
        tree = os.path.join(self.export_a, "tree")
        os.makedirs(tree)
        os.chmod(tree, 0o755)
        self.write(os.path.join(tree, "real.bin"), 4096, seed=4)
        os.symlink(target, os.path.join(tree, "leak.bin"))
        proc = self.cp(tree, "site-b:/ckpt/tree", user="nobody")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(os.listdir(self.sites.path("site-b", "ckpt", "tree")), ["real.bin"])
        self.assertEqual([e["path"] for e in json.loads(proc.stdout)["skipped"]], ["leak.bin"])
        # Followed, a symlink is sent only if its caller could read the target
        # inside an export; the others are skipped and listed.
        secret = self.write(os.path.join(self.export_a, "root-only.bin"), 4096, seed=5, mode=0o600)
        os.symlink(secret, os.path.join(tree, "mine.bin"))
        proc = self.cp(tree, "site-b:/ckpt/followed", "--symlinks", "follow", user="nobody")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(os.listdir(self.sites.path("site-b", "ckpt", "followed")), ["real.bin"])
        skipped = {e["path"]: e["why"] for e in json.loads(proc.stdout)["skipped"]}
        self.assertEqual(sorted(skipped), ["leak.bin", "mine.bin"])
        self.assertIn("outside this site's exports", skipped["leak.bin"])
        self.assertIn("may not read", skipped["mine.bin"])

    def test_nobody_sends_what_it_can_read_and_nothing_else(self):
        pub = os.path.join(self.export_a, "pub")
        os.makedirs(pub)
        os.chmod(pub, 0o755)
        secret = self.write(os.path.join(pub, "secret.bin"), 4096, seed=5, mode=0o600)
        # A directory nobody may not search, inside a source directory it may.
        outer = os.path.join(self.export_a, "outer")
        private = os.path.join(outer, "private")
        os.makedirs(private)
        os.chmod(outer, 0o755)
        os.chmod(private, 0o700)
        self.write(os.path.join(private, "open.bin"), 4096, seed=6)
        mixed = os.path.join(self.export_a, "mixed")
        os.makedirs(mixed)
        os.chmod(mixed, 0o755)
        self.write(os.path.join(mixed, "a.bin"), 4096, seed=7)
        self.write(os.path.join(mixed, "b.bin"), 4096, seed=8, mode=0o600)
        for src, needle in ((secret, "may not read"), (outer, f"may not search directory {private}"),
                            (mixed, os.path.join(mixed, "b.bin"))):
            proc = self.cp(src, "site-b:/ckpt/x", user="nobody")
            self.assert_refused(proc, needle, f"uid {NOBODY_UID} (nobody)")
        log = self.sites.log("site-a")
        self.assertIn(f"control call Submit from uid {NOBODY_UID} (nobody) refused", log)

        # What nobody may read goes: world-readable, or through its group.
        ok = self.write(os.path.join(pub, "ok.bin"), 300000, seed=9)
        proc = self.cp(ok, "site-b:/ckpt/ok.bin", user="nobody")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(ok, "rb") as a, open(self.sites.path("site-b", "ckpt", "ok.bin"), "rb") as b:
            self.assertEqual(a.read(), b.read())
        group = self.write(os.path.join(pub, "group.bin"), 4096, seed=10, mode=0o640)
        os.chown(group, 0, NOBODY_GID)
        proc = self.cp(group, "site-b:/ckpt/group.bin", user="nobody")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        # Root reads everything inside the exports.
        proc = self.cp(secret, "site-b:/ckpt/secret.bin")
        self.assertEqual(proc.returncode, 0, proc.stderr)


class ControlTokenRoleTest(unittest.TestCase):
    """The TCP control address: a viewer token reads, an operator token does everything."""

    OPERATOR = "op-" + "4be1d2" * 6
    VIEWER = "view-" + "90ac37" * 6

    def setUp(self):
        self.token_dir = tempfile.mkdtemp(prefix="lh-token-")
        self.addCleanup(shutil.rmtree, self.token_dir, True)
        self.operator_file = self.write_token("operator.token", self.OPERATOR)
        self.viewer_file = self.write_token("viewer.token", self.VIEWER)
        self.sites = lh.Sites("control_listen: 127.0.0.1:0\n"
                              "control_tokens:\n"
                              f"  operator: {self.operator_file}\n"
                              f"  viewer: {self.viewer_file}\n")
        self.addCleanup(self.sites.cleanup)
        self.sites.up()
        ready = [l for l in self.sites.log("site-a").splitlines() if "control also on tcp" in l]
        self.assertEqual(len(ready), 1, self.sites.log("site-a"))
        self.address = ready[0].split("control also on tcp ")[1].split()[0]

    def write_token(self, name, token):
        path = os.path.join(self.token_dir, name)
        with open(path, "w") as f:
            f.write(token + "\n")
        os.chmod(path, 0o600)
        return path

    def tcp_cli(self, token_file, *args):
        cmd = [os.path.join(lh.BIN, "longhaul"), "--daemon", self.address, "--token-file", token_file]
        env = {k: v for k, v in os.environ.items() if k != "LONGHAUL_TOKEN_FILE"}
        return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=120, env=env)

    def test_viewer_reads_but_cannot_submit_or_cancel_and_operator_can(self):
        src = self.sites.path("f.bin")
        lh.write_random(src, 4 << 20, seed=11)
        proc = self.tcp_cli(self.viewer_file, "cp", src, "site-b:/ckpt/f.bin")
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        self.assertIn("the viewer role may not Submit", proc.stderr)
        listed = json.loads(self.sites.cli("a", "ls", "--all", "--json", check=True).stdout)
        self.assertEqual(listed["transfers"], [])

        # A slow transfer, so that it is still running when cancelled.
        self.sites.cli("a", "limit", "--peer", "site-b", "2Mbit", check=True)
        proc = self.tcp_cli(self.operator_file, "cp", src, "site-b:/ckpt/f.bin", "--chunk-size", "64KiB")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        tid = proc.stdout.strip()
        for args in (("status", tid, "--json"), ("ls", "--json"), ("peers", "--json"), ("limit",)):
            proc = self.tcp_cli(self.viewer_file, *args)
            self.assertEqual(proc.returncode, 0, f"viewer {args}: {proc.stderr}")
        for args in (("cancel", tid), ("pause", tid), ("resume", tid),
                     ("limit", "--peer", "site-b", "off")):
            proc = self.tcp_cli(self.viewer_file, *args)
            self.assertEqual(proc.returncode, 2, f"viewer {args}: {proc.stdout}{proc.stderr}")
            self.assertIn("the viewer role may not", proc.stderr)
        status = json.loads(self.tcp_cli(self.viewer_file, "status", tid, "--json").stdout)
        self.assertIn(status["state"], ("QUEUED", "RUNNING"))
        log = self.sites.log("site-a")
        for method in ("Submit", "Cancel", "Pause", "Resume", "SetLimit"):
            self.assertIn(f"control call {method} from ipv4:127.0.0.1:", log)
        self.assertIn("(token role viewer) refused", log)

        proc = self.tcp_cli(self.operator_file, "cancel", tid)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.sites.status("a", tid)["state"] == "CANCELLED":
                break
            time.sleep(0.1)
        self.assertEqual(self.sites.status("a", tid)["state"], "CANCELLED")
        proc = self.tcp_cli(self.viewer_file, "verify", tid, "--json")
        self.assertNotIn("may not", proc.stderr)


if __name__ == "__main__":
    unittest.main()
