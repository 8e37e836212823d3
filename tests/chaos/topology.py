"""The campaign's sites: three daemons, the link emulator they talk through,
and the small file systems the disk faults fill.

Layout under the run directory DIR:
  DIR/site-N/ckpt      the export `ckpt` (site-3's is a small tmpfs, or a
                       faultfs over one, so that it can be filled)
  DIR/site-N/state     the state directory (site-2's is a small tmpfs)
  DIR/run/site-N.*     config, log and control socket, never on a faulty fs
Every daemon is a child of this process, so its exit status is known: the
checker tells exits the nemesis caused from any other.
"""

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import lh  # noqa: E402

SITES = ("site-1", "site-2", "site-3")
SOURCE_SITE = "site-1"  # the trainer writes here
STATE_DISK_SITE = "site-2"  # state directory on a small tmpfs
DEST_DISK_SITE = "site-3"  # export on a small tmpfs (under faultfs when it is built)
PORT = 7700
STATE_DISK_SIZE = "64m"
DEST_DISK_SIZE = "256m"
FAULTFS_BIN = os.path.join(lh.BIN, "longhaul-faultfs")
FAULTFS_PY = os.path.join(os.path.dirname(__file__), "faultfs.py")
WANEM = os.environ.get("LONGHAUL_WANEM", os.path.join(lh.BIN, "longhaul-wanem"))


def load_faultfs():
    """The FaultFs class of tests/chaos/faultfs.py, or None (with why) when it
    or build/bin/longhaul-faultfs is missing."""
    if not os.path.exists(FAULTFS_PY):
        return None, "tests/chaos/faultfs.py is missing"
    if not os.access(FAULTFS_BIN, os.X_OK):
        return None, f"{FAULTFS_BIN} is not built"
    spec = importlib.util.spec_from_file_location("faultfs", FAULTFS_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FaultFs, ""


class Emulator:
    """longhaul-wanem --sites=3: a star of network namespaces, one per site."""

    def __init__(self, run_dir, rate, delay):
        self.run_dir = run_dir
        self.rate = rate
        self.delay = delay
        self.proc = None
        self.env = {}
        self.ctl_path = os.path.join(run_dir, "wanem.sock")
        self.has_loss = False

    def start(self):
        ready = os.path.join(self.run_dir, "wanem.env")
        self.log_path = os.path.join(self.run_dir, "wanem.log")
        with open(self.log_path, "w") as out:
            self.proc = subprocess.Popen(
                [WANEM, f"--sites={len(SITES)}", f"--rate={self.rate}", f"--delay={self.delay}",
                 "--queue=bdp", "--mtu=9000", f"--control={self.ctl_path}", f"--ready-file={ready}"],
                stdout=out, stderr=subprocess.STDOUT)

        def ready_file():
            if self.proc.poll() is not None:
                raise AssertionError("longhaul-wanem exited: " + open(self.log_path).read())
            return os.path.exists(ready) and os.path.getsize(ready) > 0

        lh.wait_until(ready_file, 30, "the emulator's ready file", interval=0.1)
        with open(ready) as f:
            for line in f:
                if "=" in line:
                    key, value = line.strip().removeprefix("export ").split("=", 1)
                    self.env[key] = value.strip("'\"")
        # A loss burst needs the emulator's runtime `loss` command.
        self.has_loss = self.ctl_ok("loss", "0", "1")
        return self

    def namespace(self, index):
        return self.env[f"LHW_NS_{index}"]

    def address(self, index):
        return self.env[f"LHW_ADDR_{index}"]

    def ctl_ok(self, *command):
        return subprocess.run([WANEM, "ctl", self.ctl_path, *command], capture_output=True,
                              timeout=30).returncode == 0

    def ctl(self, *command):
        proc = subprocess.run([WANEM, "ctl", self.ctl_path, *command], capture_output=True, text=True,
                              timeout=30)
        if proc.returncode != 0:
            raise AssertionError(f"wanem ctl {' '.join(command)}: {proc.stderr}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Daemon:
    """One site's longhauld, started (and restarted) by this process."""

    def __init__(self, topo, site):
        self.topo = topo
        self.site = site
        self.index = SITES.index(site) + 1
        run = topo.path("run")
        self.config = os.path.join(run, f"{site}.yaml")
        self.log_path = os.path.join(run, f"{site}.log")
        self.socket = os.path.join(run, f"{site}.sock")
        self.proc = None
        self.expected_exit = False  # set by the nemesis right before it kills
        self.exits = []  # (pid, returncode, expected)
        self.lock = threading.Lock()

    @property
    def address(self):
        return "unix:" + self.socket

    @property
    def pid(self):
        return self.proc.pid

    def write_config(self):
        others = [s for s in SITES if s != self.site]
        host = self.topo.host(self.site)
        peers = "".join(f"  - site: {o}\n    address: {self.topo.host(o)}:{self.topo.port(o)}\n"
                        for o in others)
        d = self.topo.path(self.site)
        pki = self.topo.path("pki")
        with open(self.config, "w") as f:
            f.write(f"""site: {self.site}
listen: {host}:{self.topo.port(self.site)}
state_dir: {d}/state
control_socket: {self.socket}
tls:
  ca: {pki}/ca.pem
  cert: {pki}/{self.site}.pem
  key: {pki}/{self.site}.key
exports:
  - name: ckpt
    path: {d}/ckpt
    writers: [{", ".join(others)}]
    readers: [{", ".join(others)}]
  - name: local
    path: {self.topo.dir}
peers:
{peers}link:
  bandwidth: {self.topo.link_rate}
  rtt: {self.topo.rtt}
metrics:
  listen: 127.0.0.1:0
""")

    def start(self):
        with self.lock:
            if os.path.exists(self.socket):
                os.unlink(self.socket)
            cmd = [os.path.join(lh.BIN, "longhauld"), "--config", self.config]
            if self.topo.emulator:
                cmd = ["ip", "netns", "exec", self.topo.emulator.namespace(self.index), *cmd]
            with open(self.log_path, "a") as out:
                # `ip netns exec` execs the daemon: the child is longhauld itself.
                self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
            self.expected_exit = False

        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.site} exited at start ({self.proc.returncode}): "
                                     + self.log_tail())
            return os.path.exists(self.socket) and self.cli("ls", timeout=10).returncode == 0

        lh.wait_until(ready, 60, f"{self.site} to serve", interval=0.1)

    def cli(self, *args, timeout=600):
        """Runs the CLI against this site; exit code 124 when it ran out of
        `timeout` (or the campaign stopped it: Topology.kill_clis)."""
        cmd = [os.path.join(lh.BIN, "longhaul"), "--daemon", self.address, *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with self.topo.clis_lock:
            self.topo.clis.add(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
            code = proc.returncode
            if code == -signal.SIGKILL and proc in self.topo.clis_killed:
                code, err = 124, err + "stopped by the campaign"
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            code, err = 124, err + f"timed out after {timeout:.0f}s"
        finally:
            with self.topo.clis_lock:
                self.topo.clis.discard(proc)
        return subprocess.CompletedProcess(cmd, code, out, err)

    def signal(self, sig):
        os.kill(self.proc.pid, sig)

    def kill(self):
        """SIGKILL, as the nemesis does: the exit is expected."""
        with self.lock:
            self.expected_exit = True
            self.proc.kill()
            self.reap()

    def reap(self):
        """Waits for the daemon (and every thread of it) to be gone; records its exit."""
        code = self.proc.wait()
        lh.wait_until(lambda: lh.process_gone(self.proc.pid), 60,
                      f"{self.site} (pid {self.proc.pid}) to be gone", interval=0.05)
        self.exits.append((self.proc.pid, code, self.expected_exit))
        return code

    def terminate(self):
        """SIGTERM at the end of the run; returns the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        with self.lock:
            self.expected_exit = True
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            code = self.reap()
            return code

    def log_tail(self, lines=30):
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def export(self):
        return self.topo.path(self.site, "ckpt")

    def staging(self):
        return os.path.join(self.export(), ".longhaul", "staging")


class Topology:
    """The emulator (when the machine allows it), the mounts and the daemons.
    cleanup() undoes whatever up() got done, also half-way."""

    def __init__(self, run_dir, link_rate="400Mbit", delay="5ms", use_emulator=True,
                 use_faultfs=True, seed=0):
        self.dir = run_dir
        self.link_rate = link_rate
        self.delay = delay
        self.rtt = f"{4 * int(delay.removesuffix('ms'))}ms"
        self.seed = seed
        self.emulator = None
        self.skipped = {}  # nemesis kind -> why it cannot run here
        self.want_emulator = use_emulator
        self.want_faultfs = use_faultfs
        self.mounts = []  # mountpoints to unmount, innermost last
        self.faultfs = None
        self.ports = {}
        self.daemons = {s: Daemon(self, s) for s in SITES}
        self.clis = set()  # CLI processes running now
        self.clis_killed = set()
        self.clis_lock = threading.Lock()

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def host(self, site):
        if self.emulator:
            return self.emulator.address(SITES.index(site) + 1)
        return "127.0.0.1"

    def port(self, site):
        return self.ports.get(site, PORT)

    def up(self):
        os.makedirs(self.path("run"), exist_ok=True)
        root = os.geteuid() == 0
        if self.want_emulator and root and os.path.exists("/dev/net/tun"):
            self.emulator = Emulator(self.path("run"), self.link_rate, self.delay).start()
            if not self.emulator.has_loss:
                self.skipped["loss"] = "longhaul-wanem has no runtime `loss` command"
        else:
            why = "no emulator (needs root and /dev/net/tun)" if self.want_emulator else \
                "--no-emulator"
            for kind in ("link_cut", "partition", "loss"):
                self.skipped[kind] = why
            for site in SITES:
                self.ports[site] = free_port()
        # Mounted first: faultfs wants an empty mountpoint.
        if root:
            self.tmpfs(self.path(STATE_DISK_SITE, "state"), STATE_DISK_SIZE)
            self.mount_dest_disk()
        else:
            for kind in ("dest_full", "state_full", "eio", "power_loss"):
                self.skipped[kind] = "needs root to mount a tmpfs"
        for site in SITES:
            os.makedirs(self.path(site, "ckpt"), exist_ok=True)
            os.makedirs(self.path(site, "state"), exist_ok=True)
        subprocess.run(["bash", os.path.join(lh.ROOT, "deploy", "pki.sh"), self.path("pki"),
                        *SITES], check=True, capture_output=True)
        for d in self.daemons.values():
            d.write_config()
        for d in self.daemons.values():
            d.start()
        return self

    def tmpfs(self, mountpoint, size):
        os.makedirs(mountpoint, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", mountpoint],
                       check=True)
        self.mounts.append(mountpoint)

    def mount_dest_disk(self):
        """DEST_DISK_SITE's export and state on a tmpfs; under faultfs when
        it is built, so that staging can return EIO and lose unsynced data."""
        site_dir = self.path(DEST_DISK_SITE)
        faultfs_class, why = load_faultfs() if self.want_faultfs else (None, "--no-faultfs")
        if faultfs_class is None:
            self.skipped["eio"] = self.skipped["power_loss"] = why
            self.tmpfs(self.path(DEST_DISK_SITE, "ckpt"), DEST_DISK_SIZE)
            self.dest_disk = self.path(DEST_DISK_SITE, "ckpt")
            return
        backing = self.path("backing-" + DEST_DISK_SITE)
        self.tmpfs(backing, DEST_DISK_SIZE)
        for sub in ("ckpt", "state"):
            os.makedirs(os.path.join(backing, sub), exist_ok=True)
        os.makedirs(site_dir, exist_ok=True)
        self.faultfs = faultfs_class(backing, site_dir, seed=self.seed)
        self.faultfs.mount()
        self.dest_disk = backing  # filled directly: faultfs passes ENOSPC through

    def filler(self, kind):
        if kind == "dest_full":
            return os.path.join(self.dest_disk, "chaos-filler")
        return self.path(STATE_DISK_SITE, "state", "chaos-filler")

    def kill_clis(self):
        """Stops every CLI still running (a transfer that never ends keeps
        its `cp --wait` waiting)."""
        with self.clis_lock:
            for proc in self.clis:
                self.clis_killed.add(proc)
                proc.kill()

    def cleanup(self):
        self.kill_clis()
        for d in self.daemons.values():
            if d.proc is not None and d.proc.poll() is None:
                d.proc.send_signal(signal.SIGCONT)
                d.proc.kill()
                d.proc.wait()
        if self.faultfs is not None:
            try:
                self.faultfs.thaw()
            except Exception:  # noqa: BLE001 - cleanup goes on whatever state it is in
                pass
            self.faultfs.cleanup()
        for mountpoint in reversed(self.mounts):
            if subprocess.run(["umount", mountpoint], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", mountpoint], capture_output=True)
        self.mounts = []
        if self.emulator:
            self.emulator.stop()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
