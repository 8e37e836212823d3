"""Client of longhaul-faultfs, the fault-injecting FUSE passthrough
(tests/chaos/faultfs/README.md): mounts it, and drives EIO, freeze and
power loss through its control socket.

    fs = FaultFs(backing_dir, mountpoint, seed=7).mount()
    try:
        fs.set_eio("write,fsync", 0.05, path_substring="/.longhaul/")
        ...
        fs.clear_eio()
    finally:
        fs.cleanup()

Power loss of a daemon whose state directory and export live on FaultFs
mounts (every mount of that daemon, in this order):

    1. freeze() every mount: from now on no operation reaches the disk;
    2. SIGKILL the daemon and wait until it is gone (a request blocked on a
       frozen mount is answered EINTR when its task is killed, so the
       daemon dies while frozen);
    3. drop_unsynced() every mount: each file loses every byte written since
       its last fsync/fdatasync (size and old bytes come back; a file never
       synced comes back empty); names, renames, unlinks and mkdirs stay;
    4. thaw() every mount;
    5. restart the daemon on the same directories.

Needs root, /dev/fuse and build/bin/longhaul-faultfs (LONGHAUL_BIN or
LONGHAUL_FAULTFS select another); `FaultFs.unavailable()` says why a test
must skip.
"""

import json
import os
import signal
import socket
import subprocess
import time

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def binary():
    """Path of longhaul-faultfs."""
    if os.environ.get("LONGHAUL_FAULTFS"):
        return os.environ["LONGHAUL_FAULTFS"]
    bin_dir = os.environ.get("LONGHAUL_BIN", os.path.join(_ROOT, "build", "bin"))
    return os.path.join(bin_dir, "longhaul-faultfs")


def _mounted(path):
    """True while `path` is a mount point in this mount namespace."""
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            # Field 5 is the mount point, with spaces etc. octal-escaped.
            point = line.split()[4].encode().decode("unicode_escape")
            if point == real:
                return True
    return False


class FaultFsError(RuntimeError):
    pass


class FaultFs:
    """One longhaul-faultfs mount of `backing_dir` at `mountpoint`."""

    def __init__(self, backing_dir, mountpoint, seed=0):
        self.backing_dir = os.path.abspath(backing_dir)
        self.mountpoint = os.path.abspath(mountpoint)
        self.seed = seed
        base = self.mountpoint.rstrip("/") + ".faultfs"
        self.control = base + ".sock"
        self.ready_file = base + ".ready"
        self.log_path = base + ".log"
        self.proc = None
        self._log = None

    @staticmethod
    def unavailable():
        """Why longhaul-faultfs cannot run here, or None when it can."""
        if not os.path.exists(binary()):
            return (f"{binary()} is not built (needs libfuse3-dev: deploy/install-deps.sh, "
                    "then cmake again)")
        if os.geteuid() != 0:
            return "longhaul-faultfs needs root (it mounts with allow_other)"
        if not os.path.exists("/dev/fuse"):
            return "/dev/fuse is missing"
        return None

    def mount(self, timeout=30):
        """Starts longhaul-faultfs and waits until the mount answers;
        returns self."""
        os.makedirs(self.backing_dir, exist_ok=True)
        os.makedirs(self.mountpoint, exist_ok=True)
        for stale in (self.control, self.ready_file):
            if os.path.exists(stale):
                os.unlink(stale)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [binary(), self.backing_dir, self.mountpoint, f"--control={self.control}",
             f"--ready-file={self.ready_file}"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.ready_file):
            if self.proc.poll() is not None:
                raise FaultFsError(f"longhaul-faultfs exited {self.proc.returncode}: "
                                   f"{self.log()}")
            if time.monotonic() > deadline:
                self.cleanup()
                raise FaultFsError(f"longhaul-faultfs did not mount in {timeout}s: {self.log()}")
            time.sleep(0.02)
        os.stat(self.mountpoint)  # the first request completes the kernel's handshake
        self._command(f"seed {self.seed}")
        return self

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-4000:]
        except FileNotFoundError:
            return ""

    def _command(self, line):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(120)
            s.connect(self.control)
            s.sendall(line.encode() + b"\n")
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                reply += chunk
        reply = reply.decode().strip()
        if not reply.startswith("ok"):
            raise FaultFsError(f"longhaul-faultfs {line!r}: {reply or 'no answer'}")
        return reply[2:].strip()

    def set_eio(self, ops, probability=1.0, path_substring=""):
        """Operations of the kinds `ops` (a comma list or a list of read,
        write, fsync, create, rename, unlink, mkdir, open) under paths
        containing `path_substring` fail with EIO with `probability`."""
        if not isinstance(ops, str):
            ops = ",".join(ops)
        if any(c.isspace() for c in path_substring):
            raise ValueError("path_substring cannot hold whitespace")
        self._command(f"eio {ops} {probability!r} {path_substring}".rstrip())

    def clear_eio(self):
        self._command("eio off")

    def freeze(self):
        """Every new operation blocks until thaw(); returns once none is in
        progress."""
        self._command("freeze")

    def thaw(self):
        self._command("thaw")

    def drop_unsynced(self):
        """Power loss. Call only while frozen and after killing the writers."""
        self._command("drop-unsynced")

    def stats(self):
        """{ops, eio_injected, bytes_undone, files_undone, unsynced_files,
        frozen, parked, parked_pids, interrupted}."""
        return json.loads(self._command("stats"))

    def cleanup(self):
        """Unmounts (lazily if busy) and stops the process; idempotent."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None
        if _mounted(self.mountpoint):
            if subprocess.run(["umount", self.mountpoint], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", self.mountpoint], capture_output=True)
        if self._log is not None:
            self._log.close()
            self._log = None
        for stale in (self.control, self.ready_file):
            if os.path.exists(stale):
                os.unlink(stale)
