"""Helpers for longhaul's integration tests: local sites, the CLI, test trees.

Every test gets its own directory and daemons (deploy/local-sites.sh) and
tears them down in cleanup, also when it fails.
"""

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("LONGHAUL_BIN", os.path.join(ROOT, "build", "bin"))
LOCAL_SITES = os.path.join(ROOT, "deploy", "local-sites.sh")
# Set LONGHAUL_TEST_TRANSPORT=udp to run the same tests over the udp transport.
TRANSPORT = os.environ.get("LONGHAUL_TEST_TRANSPORT", "")


class Sites:
    """Two local daemons, site-a and site-b, under one temporary directory."""

    def __init__(self, extra_config=""):
        self.dir = tempfile.mkdtemp(prefix="lh-it-")
        self.extra_config = extra_config
        self.env = {}

    def up(self):
        env = dict(os.environ, LONGHAUL_BIN=BIN, LONGHAUL_LOCAL_EXTRA=self.extra_config)
        proc = subprocess.run([LOCAL_SITES, "up", self.dir], env=env, capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise AssertionError(f"local-sites up failed ({proc.returncode}): {proc.stderr}")
        out = proc.stdout
        for line in out.splitlines():
            key, value = line.removeprefix("export ").split("=", 1)
            self.env[key] = value
        return self

    def down(self):
        subprocess.run([LOCAL_SITES, "down", self.dir], capture_output=True)

    def cleanup(self):
        self.down()
        shutil.rmtree(self.dir, ignore_errors=True)

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def export(self, site):
        return self.path(site, "ckpt")

    def pid(self, site):
        with open(self.path(site, "longhauld.pid")) as f:
            return int(f.read())

    def kill(self, site, sig=signal.SIGKILL):
        pid = self.pid(site)
        os.kill(pid, sig)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            # A killed child of setsid'd bash is reaped by init; poll /proc.
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split()[2] == "Z":
                        return
            except FileNotFoundError:
                return
            time.sleep(0.05)
        raise AssertionError(f"{site} (pid {pid}) did not exit")

    def log(self, site):
        with open(self.path(site, "longhauld.log")) as f:
            return f.read()

    def cli(self, site, *args, check=False, timeout=300):
        """Runs `longhaul --daemon SITE args...`; returns CompletedProcess."""
        daemon = self.env["LONGHAUL_SITE_" + site[-1].upper()]
        if TRANSPORT and args and args[0] in ("cp", "sync") and "--transport" not in args:
            args = (*args, "--transport", TRANSPORT)
        cmd = [os.path.join(BIN, "longhaul"), "--daemon", daemon, *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{cmd} exited {proc.returncode}: {proc.stderr}{proc.stdout}")
        return proc

    def cp(self, *args, wait=True, **kw):
        extra = ["--wait"] if wait else []
        proc = self.cli("a", "cp", *args, *extra, "--json", **kw)
        return proc, (json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None)

    def status(self, site, transfer_id):
        proc = self.cli(site, "status", transfer_id, "--json", check=True)
        return json.loads(proc.stdout)

    def wait_state(self, site, transfer_id, states, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                s = self.status(site, transfer_id)
                if s["state"] in states:
                    return s
            except AssertionError:
                pass  # daemon restarting
            time.sleep(0.1)
        logs = "".join(f"\n--- {s} log ---\n" + "".join(self.log(s).splitlines(True)[-15:])
                       for s in ("site-a", "site-b"))
        raise AssertionError(f"{transfer_id} did not reach {states} in {timeout}s{logs}")


class SitesTestCase(unittest.TestCase):
    extra_config = ""

    def setUp(self):
        self.sites = Sites(self.extra_config)
        self.addCleanup(self.sites.cleanup)
        self.sites.up()


def write_random(path, size, seed):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rng = random.Random(seed)
    with open(path, "wb") as f:
        remaining = size
        while remaining:
            n = min(remaining, 1 << 20)
            f.write(rng.randbytes(n))
            remaining -= n


def tree_digest(root):
    """{relative path: (sha256, size, mode, mtime_ns)} of every regular file."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            h = hashlib.sha256()
            with open(full, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            out[os.path.relpath(full, root)] = (h.hexdigest(), st.st_size, st.st_mode & 0o7777,
                                                st.st_mtime_ns)
    return out


def empty_dirs(root):
    return sorted(os.path.relpath(d, root) for d, subdirs, files in os.walk(root)
                  if not subdirs and not files and d != root)
