"""The campaign's nemesis: one fault at a time against the processes, disks
and links, and an operator who cancels, pauses and resumes on the side.

Every fault is a window in the ledger, opened before it is injected and
closed once it is healed; each heals itself (in a `finally`), so stopping
the nemesis leaves a healed system. Every choice (which fault, which site,
how long, how hard) comes from a generator seeded by the campaign's seed.

Faults (see README.md for what each one models):
  kill        SIGKILL a daemon, restart it 0-3 s later
  stop        SIGSTOP a daemon for longer than every timeout, then SIGCONT
  dest_full   fill the destination file system of site-3 for 5-20 s
  state_full  fill the state disk of site-2 for 5-20 s; resume what it paused
  link_cut    cut one direction of a site's access link for 3-20 s
  partition   cut both directions of a site's link (the site is cut off)
  loss        a loss burst of 5-30 % on a site's link
  eio         EIO from site-3's staging (faultfs)
  power_loss  site-3 loses its page cache: frozen, killed, unsynced data
              dropped, restarted (faultfs)
Operator: cancel, pause (1-10 s, then resume).
"""

import json
import os
import random
import signal
import sys
import threading
import time

import topology

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import lh  # noqa: E402

# Weights: a stop lasts a minute, so it comes less often than the rest.
DISRUPTIVE = {"kill": 4, "stop": 1, "dest_full": 2, "state_full": 2, "link_cut": 2,
              "partition": 2, "loss": 2, "eio": 2, "power_loss": 1}
STOP_SECONDS = (61.0, 70.0)  # beyond every daemon timeout (60 s for the exchange)
EIO_OPS = ("read", "write", "fsync", "create", "rename", "unlink", "mkdir", "open")


class Nemesis:
    def __init__(self, topo, ledger, seed, kinds=None):
        self.topo = topo
        self.ledger = ledger
        self.seed = seed
        self.stop_event = threading.Event()
        wanted = kinds or DISRUPTIVE
        self.kinds = {k: w for k, w in DISRUPTIVE.items() if k in wanted and k not in topo.skipped}
        self.threads = []
        self.operator_enabled = kinds is None or "cancel" in kinds or "pause" in kinds

    def start(self):
        for name, fn in (("nemesis", self.disrupt), ("operator", self.operate)):
            if name == "operator" and not self.operator_enabled:
                continue
            t = threading.Thread(target=self._loop, args=(name, fn), name=name, daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self):
        self.stop_event.set()
        for t in self.threads:
            t.join()

    def _loop(self, name, fn):
        rng = random.Random(f"{self.seed}/{name}")
        try:
            while not self.stop_event.is_set():
                self.stop_event.wait(rng.uniform(0.5, 3.0))
                if not self.stop_event.is_set():
                    fn(rng)
        except Exception:  # noqa: BLE001 - reported as a violation
            import traceback
            self.ledger.violate("nemesis", f"{name} stopped: {traceback.format_exc()[-800:]}")

    def hold(self, seconds):
        """Keeps a fault in force; a stopping nemesis still lets it run out,
        so the schedule stays the seed's."""
        time.sleep(seconds)

    # -- the disruptive faults ------------------------------------------------
    def disrupt(self, rng):
        self.revive_unexpected_exits()
        if not self.kinds:
            self.stop_event.wait(1)
            return
        kinds = sorted(self.kinds)
        kind = rng.choices(kinds, weights=[self.kinds[k] for k in kinds])[0]
        site = rng.choice(topology.SITES)
        getattr(self, "fault_" + kind)(rng, site)

    def window(self, kind, site):
        return _Window(self.ledger, kind, site)

    def revive_unexpected_exits(self):
        """A daemon that exited without the nemesis is a violation (checked
        at the end); restarting it lets the campaign go on."""
        for d in self.topo.daemons.values():
            if d.proc.poll() is not None:
                d.reap()
                self.ledger.violate("daemon exit", f"{d.site} exited {d.proc.returncode} without "
                                                   f"the nemesis:\n{d.log_tail()}")
                d.start()

    def fault_kill(self, rng, site):
        d = self.topo.daemons[site]
        with self.window("kill", site):
            d.kill()
            self.hold(rng.uniform(0, 3))
            d.start()

    def fault_stop(self, rng, site):
        d = self.topo.daemons[site]
        with self.window("stop", site):
            d.signal(signal.SIGSTOP)
            try:
                self.hold(rng.uniform(*STOP_SECONDS))
            finally:
                d.signal(signal.SIGCONT)

    def fault_dest_full(self, rng, site):
        self._hold_full(rng, "dest_full", topology.DEST_DISK_SITE)

    def fault_state_full(self, rng, site):
        self._hold_full(rng, "state_full", topology.STATE_DISK_SITE,
                        # The operator's answer to "state disk full ... longhaul resume ID".
                        after=lambda: self.resume_paused(
                            lambda t: "state disk full" in t.get("error", "")))

    def _hold_full(self, rng, kind, site, after=None):
        """Fills the file system of `kind`'s filler at `site` for 5-20 s, then
        frees it and runs `after`."""
        filler = self.topo.filler(kind)
        with self.window(kind, site):
            try:
                lh.fill_filesystem(filler)
                self.hold(rng.uniform(5, 20))
            finally:
                os.unlink(filler)
                if after is not None:
                    after()

    def fault_link_cut(self, rng, site):
        k = str(topology.SITES.index(site) + 1)
        direction = rng.choice(("up", "down"))
        with self.window("link_cut", site):
            self.topo.emulator.ctl("cut", k, direction)
            try:
                self.hold(rng.uniform(3, 20))
            finally:
                self.topo.emulator.ctl("restore", k)

    def fault_partition(self, rng, site):
        k = str(topology.SITES.index(site) + 1)
        with self.window("partition", site):
            self.topo.emulator.ctl("cut", k)
            try:
                self.hold(rng.uniform(3, 20))
            finally:
                self.topo.emulator.ctl("restore", k)

    def fault_loss(self, rng, site):
        k = str(topology.SITES.index(site) + 1)
        with self.window("loss", site):
            self.topo.emulator.ctl("loss", f"{rng.uniform(0.05, 0.3):.3f}", k)
            try:
                self.hold(rng.uniform(3, 20))
            finally:
                self.topo.emulator.ctl("loss", "0", k)

    def fault_eio(self, rng, site):
        fs = self.topo.faultfs
        ops = rng.sample(EIO_OPS, rng.randint(1, 3))
        with self.window("eio", topology.DEST_DISK_SITE):
            fs.set_eio(ops, probability=rng.uniform(0.05, 0.5), path_substring=".longhaul/staging")
            try:
                self.hold(rng.uniform(3, 15))
            finally:
                fs.clear_eio()

    def fault_power_loss(self, rng, site):
        fs = self.topo.faultfs
        d = self.topo.daemons[topology.DEST_DISK_SITE]
        with self.window("power_loss", d.site):
            fs.freeze()
            try:
                d.kill()
                fs.drop_unsynced()
            finally:
                fs.thaw()
            self.hold(rng.uniform(0, 3))
            d.start()

    # -- the operator --------------------------------------------------------
    def operate(self, rng):
        self.stop_event.wait(rng.uniform(1, 6))
        site = rng.choice(topology.SITES)
        d = self.topo.daemons[site]
        proc = d.cli("ls", "--json", timeout=30)
        try:
            active = sorted(t["id"] for t in json.loads(proc.stdout)["transfers"]
                            if t["state"] in ("QUEUED", "RUNNING"))
        except (ValueError, KeyError):
            return  # the daemon is away (killed or stopped)
        if not active:
            return
        tid = rng.choice(active)
        if rng.random() < 0.3:
            with self.window("cancel", site):
                self.ledger.transfer(tid.split(".")[0], cancel_asked=time.time())
                d.cli("cancel", tid, timeout=120)
            return
        with self.window("pause", site):
            paused = d.cli("pause", tid, timeout=120).returncode == 0
            self.hold(rng.uniform(1, 10))
            if paused:
                self.resume(d, tid)

    def resume_paused(self, which):
        for d in self.topo.daemons.values():
            proc = d.cli("ls", "--json", timeout=60)
            try:
                listed = json.loads(proc.stdout)["transfers"]
            except (ValueError, KeyError):
                continue
            for t in listed:
                if t["state"] == "PAUSED" and which(t):
                    self.resume(d, t["id"])

    @staticmethod
    def resume(d, tid):
        """Resumes `tid` at `d`, again while it is still PAUSED and the
        daemon says why not (e.g. its state disk is still full)."""
        deadline = time.time() + 300
        while time.time() < deadline:
            if d.cli("resume", tid, timeout=120).returncode == 0:
                return True
            status = d.cli("status", tid, "--json", timeout=60)
            try:
                if json.loads(status.stdout)["state"] != "PAUSED":
                    return True
            except (ValueError, KeyError):
                pass
            time.sleep(1)
        return False


class _Window:
    def __init__(self, ledger, kind, site):
        self.ledger = ledger
        self.kind = kind
        self.site = site

    def __enter__(self):
        self.handle = self.ledger.fault_started(self.kind, self.site)
        return self

    def __exit__(self, *exc):
        self.ledger.fault_healed(self.handle)
