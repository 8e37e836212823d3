"""The campaign's workload: what a multi-site training job does.

  trainer     writes a versioned checkpoint step-N at the source site every
              few seconds (`.metadata` last) and prunes the oldest
  cron        `sync RUN site-2:/ckpt/run --keep 2` now and then
  publish     fan-out of the newest step to `latest` at site-2 and site-3,
              replacing the previous one (readers watch both)
  pull        site-3 pulls a step from site-1
  third-party site-2 asks site-1 to copy a step to site-3
  allreduce   an ExchangeGroup of the three sites all-reducing in a loop

Each activity is a thread with a generator seeded from the campaign's seed
and its name, so one seed gives the same sequence of choices and delays.
Every CLI run is `--wait --json`: its exit code is checked against the
states it prints, and every COMPLETED destination against its version.
"""

import json
import os
import random
import shutil
import sys
import threading
import time

import checker
import topology

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import lh  # noqa: E402

MIB = 1 << 20
SRC = topology.SOURCE_SITE
# ~4.2 MiB a version: four 1 MiB shards, 40 small files, `.metadata` last.
LAYOUT = lh.versioned_checkpoint_layout(small_files=40, shards=4, shard_size=MIB)
KEEP_AT_SOURCE = 24  # steps the trainer keeps; older ones are pruned
SETTLE_S = 900  # how long an interrupted transfer may take to end
# After the nemesis stops, how long the workload's last transfers may take
# to end; so long a final round may take too.
END_WAIT_S = 300


class Workload:
    def __init__(self, topo, ledger, seed, transport=""):
        self.topo = topo
        self.ledger = ledger
        self.seed = seed
        self.transport = transport
        self.stop_event = threading.Event()
        self.threads = []
        self.run_dir = topo.path(SRC, "ckpt", "run")
        self.steps = []  # finished steps at the source, oldest first
        self.steps_lock = threading.Lock()
        self.next_step = 1
        self.serial = 0
        self.errors = []  # exceptions that ended a workload thread
        self.deadline = None  # set once the workload is stopping: every wait ends by then
        self.watchers = [checker.WholeVersionWatcher(topo.path(site, "ckpt", "latest"), LAYOUT)
                         for site in ("site-2", "site-3")]
        ledger.watchers = self.watchers
        try:
            import longhaul  # noqa: F401 - the Python binding, built into build/python
            import numpy  # noqa: F401
            self.no_allreduce = ""
        except ImportError as e:
            self.no_allreduce = f"the Python binding is not importable ({e})"
            ledger.skipped_workload["allreduce"] = self.no_allreduce

    def rng(self, name):
        return random.Random(f"{self.seed}/{name}")

    def daemon(self, site):
        return self.topo.daemons[site]

    def timeout(self, most=600):
        """A CLI call's timeout: `most`, cut to what is left before the deadline."""
        if self.deadline is None:
            return most
        return max(5.0, min(most, self.deadline - time.time()))

    def past_deadline(self):
        return self.deadline is not None and time.time() > self.deadline

    def unique(self, prefix):
        with self.steps_lock:
            self.serial += 1
            return f"{prefix}-{self.seed}-{self.serial}"

    # -- the source's checkpoints -----------------------------------------
    def write_step(self):
        with self.steps_lock:
            step = self.next_step
            self.next_step += 1
        lh.write_versioned_checkpoint(os.path.join(self.run_dir, f"step-{step}"), step, LAYOUT)
        with self.steps_lock:
            self.steps.append(step)
            old = self.steps[:-KEEP_AT_SOURCE]
            del self.steps[:-KEEP_AT_SOURCE]
        for s in old:
            shutil.rmtree(os.path.join(self.run_dir, f"step-{s}"), ignore_errors=True)
        self.ledger.count("checkpoints written")
        return step

    def pick_step(self, rng):
        """A recent finished step: the newest, or one of the few before it."""
        with self.steps_lock:
            recent = self.steps[-4:]
        return recent[-1] if rng.random() < 0.6 else rng.choice(recent)

    # -- running and checking one CLI transfer --------------------------------
    def transfer(self, what, site, args, request_id):
        """Runs `longhaul cp ARGS --wait --json` at `site`; checks its exit
        code; returns (id, state) once the transfer has ended (following it
        when the CLI could not)."""
        extra = ["--transport", self.transport] if self.transport else []
        proc = self.daemon(site).cli("cp", *args, *extra, "--wait", "--json",
                                     "--request-id", request_id, timeout=self.timeout())
        out = _json(proc.stdout)
        state = out.get("state") if out else None
        self.ledger.check_cli(what, proc, [state] if state else [])
        tid = out.get("id") if out else None
        if tid is None:
            tid = self.resubmit_for_id(site, args, extra, request_id, proc)
            if tid is None:
                return None, None
        if state not in checker.END_STATES:
            state, out = self.settle(site, tid)
        self.ledger.transfer(tid, kind=what, site=site, state=state,
                             error=(out or {}).get("error", ""), ended=time.time())
        return tid, state

    def resubmit_for_id(self, site, args, extra, request_id, first):
        """The id of a transfer whose `cp --wait` ended without printing it:
        the same request id returns the same transfer (or submits it, when
        the first call never reached the daemon)."""
        deadline = min(time.time() + SETTLE_S, self.deadline or float("inf"))
        while time.time() < deadline:
            proc = self.daemon(site).cli("cp", *args, *extra, "--json", "--request-id", request_id,
                                         timeout=self.timeout(60))
            out = _json(proc.stdout)
            if out and out.get("id"):
                return out["id"]
            if proc.returncode == 2 or (proc.returncode == 1 and "state disk full" not in
                                        proc.stderr + proc.stdout):
                return None  # refused: nothing was started
            time.sleep(1)
        if self.past_deadline():
            return None  # stopping: the campaign lists what has not ended
        self.ledger.violate("transfer ends", f"no transfer id for request {request_id} at {site}; "
                                             f"first call: {first.stderr[-300:]}")
        return None

    def settle(self, site, tid):
        """Follows `tid` at `site` until it ends."""
        deadline = min(time.time() + SETTLE_S, self.deadline or float("inf"))
        while time.time() < deadline:
            proc = self.daemon(site).cli("status", tid, "--json", timeout=self.timeout(60))
            out = _json(proc.stdout)
            if out and out.get("state") in checker.END_STATES:
                return out["state"], out
            time.sleep(0.5)
        if not self.past_deadline():  # stopping: the campaign lists what has not ended
            self.ledger.violate("transfer ends", f"{tid} at {site} did not end in {SETTLE_S}s: "
                                                 f"{self.last_status(site, tid)}")
        return None, None

    def checked(self, what, tid, state, started, dests, step):
        """Counts the end state; a COMPLETED transfer's destinations must hold `step`."""
        if tid is None:
            return False
        self.ledger.count(f"transfers {state}")
        if state == "COMPLETED":
            ok = True
            for path in dests:
                ok = self.ledger.verify_destination(f"{what} {tid}", path, step, LAYOUT) and ok
            return ok
        if state == "FAILED":
            error = self.ledger.transfers.get(tid, {}).get("error", "")
            self.ledger.check_failed(tid, error, started, time.time())
        return False

    # -- the activities ------------------------------------------------------
    def trainer(self, rng):
        self.stop_event.wait(rng.uniform(3, 6))
        self.write_step()

    def cron(self, rng):
        self.stop_event.wait(rng.uniform(4, 10))
        self.sync_keep()

    def sync_keep(self):
        started = time.time()
        extra = ["--transport", self.transport] if self.transport else []
        proc = self.daemon(SRC).cli("sync", self.run_dir, "site-2:/ckpt/run", "--keep", "2",
                                    "--wait", "--json", *extra, timeout=self.timeout())
        lines = [_json(line) for line in proc.stdout.splitlines()]
        lines = [line for line in lines if line]
        self.ledger.check_cli("sync --keep", proc, [line.get("state") for line in lines])
        ok = bool(lines) and proc.returncode == 0
        for line in lines:
            tid, state = line.get("id"), line.get("state")
            if state not in checker.END_STATES:
                state, line = self.settle(SRC, tid)
                line = line or {}
            self.ledger.transfer(tid, kind="sync", site=SRC, state=state,
                                 error=line.get("error", ""), ended=time.time())
            dest = line.get("destination", "")
            name = dest.rsplit("/", 1)[-1]
            if not name.startswith("step-"):
                continue
            step = int(name.removeprefix("step-"))
            path = self.topo.path("site-2", "ckpt", "run", name)
            ok = self.checked("sync", tid, state, started, [path], step) and ok
        return ok

    def publish(self, rng=None):
        if rng:
            self.stop_event.wait(rng.uniform(2, 6))
        step = self.pick_step(rng) if rng else self.steps[-1]
        started = time.time()
        src = os.path.join(self.run_dir, f"step-{step}")
        # Each publish replaces the step before it at `latest`.
        tid, state = self.transfer("fan-out", SRC, [src, "site-2:/ckpt/latest", "--also",
                                                    "site-3:/ckpt/latest", "--replace"],
                                   self.unique("publish"))
        dests = [self.topo.path(s, "ckpt", "latest") for s in ("site-2", "site-3")]
        return self.checked("fan-out", tid, state, started, dests, step)

    def pull(self, rng=None):
        if rng:
            self.stop_event.wait(rng.uniform(3, 8))
        return self.remote_copy("pull", "site-3", "site-3", "pulled", rng)

    def third_party(self, rng=None):
        if rng:
            self.stop_event.wait(rng.uniform(3, 8))
        return self.remote_copy("third-party", "site-2", "site-3", "tp", rng)

    def remote_copy(self, what, at, dest_site, folder, rng):
        step = self.pick_step(rng) if rng else self.steps[-1]
        name = self.unique(f"step-{step}")
        started = time.time()
        tid, state = self.transfer(what, at, [f"{SRC}:/ckpt/run/step-{step}",
                                              f"{dest_site}:/ckpt/{folder}/{name}"],
                                   self.unique(what))
        dest = self.topo.path(dest_site, "ckpt", folder, name)
        ok = self.checked(what, tid, state, started, [dest], step)
        shutil.rmtree(dest, ignore_errors=True)  # the small destination disk stays free
        return ok

    def allreduce(self, rng=None, rounds=3):
        """One group of the three sites, `rounds` all-reduces of exact sums;
        every site must end with the same, right, bytes."""
        if rng:
            self.stop_event.wait(rng.uniform(1, 4))
        import numpy as np
        import longhaul
        started = time.time()
        name = self.unique("chaos-group")
        sites = list(topology.SITES)
        self.ledger.allreduce["rounds"] += 1
        groups, error = [None] * 3, None
        try:
            joined = lh.in_parallel([lambda s=s: longhaul.ExchangeGroup(
                self.daemon(s).address, name, sites, timeout=30.0) for s in sites], timeout=None)
            for i, g in enumerate(joined):
                if isinstance(g, BaseException):
                    error = error or g
                else:
                    groups[i] = g
            for r in range(rounds if error is None else 0):
                bufs = [np.full(1 << 16, float(i + 1 + r), np.float32) for i in range(3)]
                results = lh.in_parallel([lambda g=g, b=b: g.allreduce(b, timeout=30.0)
                                          for g, b in zip(groups, bufs)], timeout=None)
                failed = [x for x in results if isinstance(x, BaseException)]
                if failed:
                    error = failed[0]
                    break
                want = np.full(1 << 16, float(6 + 3 * r), np.float32)
                if not all(b.tobytes() == want.tobytes() for b in bufs):
                    self.ledger.violate("allreduce", f"{name} round {r}: wrong or differing sums")
        finally:
            for g in groups:
                if g is not None:
                    try:
                        g.close()
                    except Exception:  # noqa: BLE001 - a closed group's daemon may be gone
                        pass
        if error is None:
            self.ledger.allreduce["ok"] += 1
            return True
        self.ledger.allreduce["failed"] += 1
        kind = checker.reason_kind(str(error))
        reasons = self.ledger.allreduce["reasons"]
        reasons[kind] = reasons.get(kind, 0) + 1
        if not self.ledger.fault_during(started, time.time()):
            self.ledger.violate("allreduce", f"{name} failed while no fault was in force: {error}")
        return False

    # -- running ---------------------------------------------------------
    def warm_up(self):
        """A fault-free round of every activity; each must succeed."""
        for _ in range(3):
            self.write_step()
        return self.round("warm-up")

    def round(self, label):
        self.deadline = time.time() + END_WAIT_S
        try:
            return self._round(label)
        finally:
            self.deadline = None

    def _round(self, label):
        results = {"sync --keep": self.sync_keep(), "fan-out": self.publish(),
                   "pull": self.pull(), "third-party": self.third_party()}
        if not self.no_allreduce:
            results["allreduce"] = self.allreduce()
        for what, ok in results.items():
            if not ok:
                self.ledger.violate("fault-free round", f"{label}: {what} did not complete")
        return all(results.values())

    def start(self):
        for w in self.watchers:
            w.interval = 0.02
            w.start()
        activities = {"trainer": self.trainer, "cron": self.cron, "publish": self.publish,
                      "pull": self.pull, "third-party": self.third_party}
        if not self.no_allreduce:
            activities["allreduce"] = self.allreduce
        for name, fn in activities.items():
            t = threading.Thread(target=self._loop, args=(name, fn), name=name, daemon=True)
            t.start()
            self.threads.append(t)

    def _loop(self, name, fn):
        rng = self.rng(name)
        try:
            while not self.stop_event.is_set():
                fn(rng)
        except Exception as e:  # noqa: BLE001 - reported as a violation
            import traceback
            self.ledger.violate("workload", f"{name} stopped: {traceback.format_exc()[-800:]}")
            self.errors.append(e)

    def last_status(self, site, tid):
        proc = self.daemon(site).cli("status", tid, "--json", timeout=30)
        out = _json(proc.stdout) or {}
        return {k: out.get(k) for k in ("state", "bytes_done", "bytes", "error", "destinations")}

    def stop(self):
        """Ends the activities: each finishes what it does, by END_WAIT_S;
        CLI calls still waiting then are stopped."""
        self.stop_event.set()
        self.deadline = time.time() + END_WAIT_S
        for t in self.threads:
            t.join(max(0.0, self.deadline - time.time()))
        if any(t.is_alive() for t in self.threads):
            self.topo.kill_clis()
            for t in self.threads:
                t.join()
        self.deadline = None

    def stop_watchers(self):
        for w in self.watchers:
            w.stop()


def _json(text):
    text = text.strip()
    if not text.startswith("{"):
        return None
    try:
        return json.loads(text.splitlines()[-1] if "\n" in text else text)
    except json.JSONDecodeError:
        return None
