"""Helpers for longhaul's integration tests: local sites, the CLI, test trees.

Every test gets its own directory and daemons (deploy/local-sites.sh) and
tears them down in cleanup, also when it fails.
"""

import errno
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("LONGHAUL_BIN", os.path.join(ROOT, "build", "bin"))
LOCAL_SITES = os.path.join(ROOT, "deploy", "local-sites.sh")
# Set LONGHAUL_TEST_TRANSPORT=udp to run the same tests over the udp transport.
TRANSPORT = os.environ.get("LONGHAUL_TEST_TRANSPORT", "")


class Sites:
    """Local daemons (site-a and site-b unless `names` says more, e.g.
    ("site-a", "site-b", "site-c")) under one temporary directory."""

    def __init__(self, extra_config="", names=("site-a", "site-b")):
        self.dir = tempfile.mkdtemp(prefix="lh-it-")
        self.extra_config = extra_config
        self.names = tuple(names)
        self.env = {}

    def _script_env(self):
        return dict(os.environ, LONGHAUL_BIN=BIN, LONGHAUL_LOCAL_EXTRA=self.extra_config,
                    LONGHAUL_LOCAL_SITES=" ".join(self.names))

    def up(self):
        proc = subprocess.run([LOCAL_SITES, "up", self.dir], env=self._script_env(),
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise AssertionError(f"local-sites up failed ({proc.returncode}): {proc.stderr}")
        out = proc.stdout
        for line in out.splitlines():
            key, value = line.removeprefix("export ").split("=", 1)
            self.env[key] = value
        return self

    def down(self):
        subprocess.run([LOCAL_SITES, "down", self.dir], env=self._script_env(), capture_output=True)

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
            if process_gone(pid):
                return
            time.sleep(0.05)
        raise AssertionError(f"{site} (pid {pid}) did not exit")

    def metrics_port(self, site):
        found = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", self.log(site))
        if not found:
            raise AssertionError(f"{site} logged no metrics address")
        return int(found.group(1))

    def scrape(self, site, timeout=30):
        """The text of `site`'s /metrics."""
        url = f"http://127.0.0.1:{self.metrics_port(site)}/metrics"
        return urllib.request.urlopen(url, timeout=timeout).read().decode()

    def metric(self, site, name, labels=None):
        """The value of one series of `site`'s /metrics; 0 when absent."""
        want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
                       if labels else "") + " "
        for line in self.scrape(site).splitlines():
            if line.startswith(want):
                return float(line[len(want):])
        return 0.0

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
                       for s in self.names)
        raise AssertionError(f"{transfer_id} did not reach {states} in {timeout}s{logs}")


class AccessSites(Sites):
    """Local sites whose exports list the writers and readers given as
    local-sites.sh entries ("site-b=site-a"); unlisted sites keep the
    default (every other site)."""

    def __init__(self, names, writers="", readers=""):
        super().__init__(names=names)
        self.writers = writers
        self.readers = readers

    def _script_env(self):
        return dict(super()._script_env(), LONGHAUL_LOCAL_WRITERS=self.writers,
                    LONGHAUL_LOCAL_READERS=self.readers)


class AccessTestCase(unittest.TestCase):
    """Each test gets fresh AccessSites `site_names`, whose exports list the
    class's `writers` and `readers` (local-sites.sh entries)."""
    site_names = ("site-a", "site-b")
    writers = ""
    readers = ""

    def setUp(self):
        self.sites = AccessSites(self.site_names, self.writers, self.readers)
        self.addCleanup(self.sites.cleanup)
        self.sites.up()


class SitesTestCase(unittest.TestCase):
    extra_config = ""
    site_names = ("site-a", "site-b")

    def setUp(self):
        self.sites = Sites(self.extra_config, self.site_names)
        self.addCleanup(self.sites.cleanup)
        self.sites.up()


def _random_blocks(size, seed):
    """`size` deterministic pseudo-random bytes, in blocks of at most 1 MiB."""
    rng = random.Random(seed)
    remaining = size
    while remaining:
        n = min(remaining, 1 << 20)
        yield rng.randbytes(n)
        remaining -= n


def write_random(path, size, seed):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        for block in _random_blocks(size, seed):
            f.write(block)


def rewrite_in_place(path, size, seed):
    """Overwrites an existing file with new random content without ever
    truncating it, as a tool that rewrites a file in place does. (Opening with
    "wb" would show a 0-byte file for a moment, and a sender may publish that
    snapshot faithfully before the writer goes on.)"""
    with open(path, "r+b") as f:
        for block in _random_blocks(size, seed):
            f.write(block)


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


# ---------------------------------------------------------------------------
# Versioned checkpoints: every file's content and mtime name the version it
# belongs to, so a reader can tell from any one file which version it holds.

def version_mtime_ns(version):
    """The mtime (ns, with a non-zero sub-second part) of every file of `version`."""
    return (1_700_000_000 + 10_000 * version) * 1_000_000_000 + 123_456_789


def version_content(version, rel, size):
    """The bytes of file `rel` in `version`: its name and version, repeated."""
    line = f"longhaul-test version {version} file {rel}\n".encode()
    return (line * (size // len(line) + 1))[:size]


def versioned_checkpoint_layout(small_files=2000, shards=4, shard_size=256 << 10):
    """{relative path: size} of a PyTorch-DCP-shaped checkpoint: shards, many
    small files in a few subdirectories, and the `.metadata` commit marker.
    Sizes depend only on the path, so every version has the same sizes."""
    layout = {f"__{i}_0.distcp": shard_size for i in range(shards)}
    for k in range(small_files):
        rel = f"extra/{k // 100:02d}/item_{k:04d}.bin"
        layout[rel] = 200 + random.Random(rel).randrange(400)
    layout[".metadata"] = 512
    return layout


def write_versioned_checkpoint(root, version, layout):
    """Writes `version` of `layout` under `root`; returns {path: bytes}."""
    contents = {}
    mtime = version_mtime_ns(version)
    for rel, size in layout.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = version_content(version, rel, size)
        with open(path, "wb") as f:
            f.write(data)
        os.utime(path, ns=(mtime, mtime))
        contents[rel] = data
    return contents


class VersionWatcher(threading.Thread):
    """Lists and reads a destination directory in a tight loop, and records
    every complete observation that is not exactly one whole version.

    An observation opens the destination, walks it through directory fds
    (os.fwalk, so a rename of the path mid-walk does not move the walk) and
    reads every file. It is complete when nothing vanished during the walk
    and the path still names the directory it started in: that is a view of
    one directory a reader could have had. Each complete observation must
    hold exactly the files of one version, each with that version's bytes.
    The destination may be missing only until it first appears (when
    `existed` is False).
    """

    def __init__(self, dest, versions, existed):
        super().__init__(daemon=True)
        self.dest = dest
        self.versions = versions  # {version: {relative path: bytes}}
        self.existed = existed
        self.stop_event = threading.Event()
        self.complete = 0
        self.incomplete = 0
        self.seen = {}  # version -> complete observations of it
        self.violations = []  # (observation number, description)
        self.kinds = {}  # kind of violation -> count
        self._owner = {}  # (rel, bytes) -> version
        for v, files in versions.items():
            for rel, data in files.items():
                self._owner[(rel, data)] = v

    def stop(self):
        self.stop_event.set()
        self.join()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def summary(self):
        return (f"{self.complete} complete observations ({self.incomplete} straddled a change), "
                f"by version: {dict(sorted(self.seen.items()))}; "
                f"violations by kind: {self.kinds}, first: {self.violations[:3]}")

    def run(self):
        while not self.stop_event.is_set():
            self.observe_guarded()

    def observe_guarded(self):
        """One observation; a reader that cannot go on is a violation, not a
        thread that dies unnoticed."""
        try:
            self._observe()
        except Exception as e:  # noqa: BLE001 - reported as the reader's failure
            self._violate(f"reader failed: {e!r}", "reader failed")
            self.stop_event.set()

    def _violate(self, what, kind=None):
        kind = kind or what
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        if len(self.violations) < 1000:
            self.violations.append((self.complete + self.incomplete, what))

    def _observe(self):
        try:
            top = os.open(self.dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            if self.existed:
                self._violate("destination missing")
            return
        except OSError as e:
            # ESTALE (FUSE, NFS): the name was swapped by a publish while it
            # was being looked up. Not a view of any version: not judged.
            if not _gone(e):
                raise
            self.incomplete += 1
            return
        self.existed = True
        files = {}
        vanished = []
        try:
            try:
                start = os.fstat(top)
            except OSError as e:
                if not _gone(e):
                    raise
                self.incomplete += 1
                return
            for dirpath, _, names, dir_fd in os.fwalk(".", dir_fd=top,
                                                      onerror=vanished.append):
                for name in names:
                    rel = os.path.normpath(os.path.join(dirpath, name))
                    try:
                        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
                        with os.fdopen(fd, "rb") as f:
                            files[rel] = f.read()
                    except OSError as e:
                        if not _gone(e):
                            raise
                        vanished.append(e)
            try:
                end = os.stat(self.dest, follow_symlinks=False)
                if (end.st_dev, end.st_ino) != (start.st_dev, start.st_ino):
                    vanished.append("replaced")
            except OSError as e:
                if not _gone(e):
                    raise
                vanished.append(e)
        finally:
            os.close(top)
        if vanished:
            self.incomplete += 1
            return
        self.complete += 1
        by_version = {}
        for rel, data in files.items():
            by_version.setdefault(self._owner.get((rel, data)), []).append(rel)
        if None in by_version:
            self._violate(f"{len(by_version[None])} files of no version, e.g. "
                          f"{sorted(by_version[None])[:3]}", "files of no version")
            return
        if len(by_version) != 1:
            self._violate("mixed: " + ", ".join(f"v{v} x{len(r)}"
                                                for v, r in sorted(by_version.items())),
                          "mixed " + "+".join(f"v{v}" for v in sorted(by_version)))
            return
        (version,) = by_version
        missing = set(self.versions[version]) - set(files)
        if missing:
            self._violate(f"v{version} without {len(missing)} of its files, e.g. "
                          f"{sorted(missing)[:3]}", f"v{version} incomplete")
            return
        self.seen[version] = self.seen.get(version, 0) + 1


def _gone(error):
    """Whether `error` says that what a handle or name named is gone: ENOENT
    on a local file system, ESTALE on FUSE and NFS for a directory that a
    publish swapped out and removed while it was held open."""
    return error.errno in (errno.ENOENT, errno.ESTALE)


def which_version(root, versions):
    """The version `root` holds exactly (every file, nothing else, right bytes,
    right mtime), else a description of what it holds."""
    try:
        found = tree_digest(root)
    except FileNotFoundError:
        return "missing"
    for v, files in versions.items():
        want = {rel: (hashlib.sha256(data).hexdigest(), len(data), version_mtime_ns(v))
                for rel, data in files.items()}
        got = {rel: (d[0], d[1], d[3]) for rel, d in found.items()}
        if got == want:
            return v
    counts = {}
    for rel, d in found.items():
        for v, files in versions.items():
            if rel in files and hashlib.sha256(files[rel]).hexdigest() == d[0]:
                counts[f"v{v}"] = counts.get(f"v{v}", 0) + 1
                break
        else:
            counts["other"] = counts.get("other", 0) + 1
    return f"no single version ({len(found)} files: {counts})"


def proc_status(pid, key):
    """A figure of /proc/PID/status: kB for the memory lines (VmRSS, VmHWM),
    a count for Threads."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {key} in /proc/{pid}/status")


def process_alive(pid):
    """True while `pid` exists and its main thread is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def process_gone(pid):
    """True once no thread of `pid` runs. A killed daemon's main thread may be
    a zombie while its io_uring workers finish in-flight I/O, and until they
    exit its descriptors (the journal's lock among them) stay open. A killed
    child of setsid'd bash is reaped by init, so /proc is polled. Reading the
    stat of a task that exits meanwhile fails with ENOENT or ESRCH."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):
        return True
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    return False
        except (FileNotFoundError, ProcessLookupError):
            continue
    return True


def fill_filesystem(path):
    """Writes `path` until its file system has no byte left."""
    with open(path, "wb", buffering=0) as f:
        for block in (1 << 20, 64 << 10, 4096, 512, 1):
            data = b"\xff" * block
            try:
                while True:
                    f.write(data)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise


def in_parallel(fns, timeout=120):
    """Runs each fn on its own thread, joining each for up to `timeout`
    seconds (None: until it returns); returns results (or the exceptions
    raised) in order."""
    results = [None] * len(fns)

    def run(i):
        try:
            results[i] = fns[i]()
        except BaseException as e:  # noqa: B902 - reported to the caller
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return results


def raise_any(results):
    """Raises the first exception among in_parallel's results; else returns them."""
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def wait_until(predicate, timeout, what, interval=0.0):
    """Polls `predicate` until it returns something true; returns that value."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        if interval:
            time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class LoopMount:
    """A file system image loop-mounted at a directory, e.g. to give a site
    an export with other properties than the build machine's (needs root).
    Register cleanup() before calling mount(): it unmounts and detaches
    whatever mount() got done, also when mount() failed half-way, and may be
    called more than once."""

    def __init__(self, image, size, mountpoint, mkfs):
        self.image = image
        self.size = size
        self.mountpoint = mountpoint
        self.mkfs = mkfs
        self.device = None
        self.mounted = False

    def mount(self):
        with open(self.image, "wb") as f:
            f.truncate(self.size)
        subprocess.run([*self.mkfs, self.image], check=True, capture_output=True)
        self.device = subprocess.run(["losetup", "--find", "--show", self.image], check=True,
                                     capture_output=True, text=True).stdout.strip()
        os.makedirs(self.mountpoint, exist_ok=True)
        subprocess.run(["mount", self.device, self.mountpoint], check=True, capture_output=True)
        self.mounted = True
        return self

    def cleanup(self):
        if self.mounted:
            if subprocess.run(["umount", self.mountpoint], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", self.mountpoint], capture_output=True)
            self.mounted = False
        if self.device:
            subprocess.run(["losetup", "-d", self.device], capture_output=True)
            self.device = None
