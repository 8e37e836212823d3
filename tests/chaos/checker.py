"""What the campaign checks, and the ledger of what happened.

Ledger: every transfer the workload started (where, what version, which
destinations, the CLI's exit code and the state it printed), every fault
window the nemesis opened, and the violations found. The checks:
  - whole-version reads: a reader through one directory handle never sees a
    mixed or partial version (WholeVersionWatcher);
  - every transfer ends, and a FAILED one names a reason while a fault was
    in force (its reasons are counted by kind);
  - a COMPLETED destination is bit-identical to the version it claims;
  - no daemon exits but by the nemesis (exit statuses, crash lines in logs);
  - staging, descriptors and threads return to their baseline;
  - the CLI's exit code matches the state it reports.
"""

import os
import re
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import lh  # noqa: E402

END_STATES = ("COMPLETED", "FAILED", "CANCELLED")
# A fault's effects outlast its heal: a backoff (up to 30 s) or a peer's
# dead-connection timeout may still fail what it touched.
FAULT_GRACE_S = 45.0
# Growth allowed over the warmed-up baseline, for pools that grow on demand.
FD_MARGIN = 32
THREAD_MARGIN = 16
# Lines a daemon writes only when it crashes or breaks an invariant.
CRASH_MARKERS = re.compile(r"^F\d{4} |Check failed|terminate called|\*\*\* SIG[A-Z]+ |"
                           r"AddressSanitizer|ThreadSanitizer|runtime error:|Segmentation fault",
                           re.M)

REASON_KINDS = (
    ("state disk full", "state disk full"),
    ("no space", r"No space left|ENOSPC|disk full"),
    ("I/O error", r"Input/output error|EIO"),
    ("cancelled", r"cancel"),
    ("source changed", r"source .*(changed|vanished|gone)|No such file|changed while"),
    ("timeout", r"timed out|deadline|stalled|did not join"),
    ("peer unreachable", r"unreachable|connect|refused|reset|closed|lost"),
)


def reason_kind(error):
    for kind, pattern in REASON_KINDS:
        if re.search(pattern, error, re.I):
            return kind
    return "other: " + error[:60]


class Ledger:
    def __init__(self):
        self.lock = threading.Lock()
        self.started = time.time()
        self.transfers = {}  # id -> record dict
        self.faults = []  # [kind, site, start, end or None]
        self.faults_by_kind = {}
        self.violations = []  # (check, detail)
        self.counts = {}  # free-form counters: cli runs, verified destinations, ...
        self.failed_reasons = {}
        self.end_states = {}
        self.watchers = []
        self.allreduce = {"rounds": 0, "ok": 0, "failed": 0, "reasons": {}}
        self.skipped_workload = {}  # activity -> why it cannot run here

    def count(self, name, n=1):
        with self.lock:
            self.counts[name] = self.counts.get(name, 0) + n

    def violate(self, check, detail):
        with self.lock:
            self.violations.append((check, detail))
        print(f"VIOLATION [{check}] {detail}", file=sys.stderr, flush=True)

    # -- faults ---------------------------------------------------------
    def fault_started(self, kind, site):
        with self.lock:
            self.faults.append([kind, site, time.time(), None])
            self.faults_by_kind[kind] = self.faults_by_kind.get(kind, 0) + 1
            return len(self.faults) - 1

    def fault_healed(self, handle):
        with self.lock:
            self.faults[handle][3] = time.time()

    def fault_during(self, start, end):
        """The faults in force (or healed less than FAULT_GRACE_S before)
        at some time in [start, end]."""
        with self.lock:
            return [f for f in self.faults
                    if f[2] <= end and (f[3] is None or f[3] + FAULT_GRACE_S >= start)]

    # -- transfers ------------------------------------------------------
    def transfer(self, tid, **record):
        with self.lock:
            self.transfers.setdefault(tid, {"id": tid, "submitted": time.time()}).update(record)

    def check_cli(self, what, proc, states):
        """The CLI's exit code against the end states it printed (`states`:
        one per transfer, empty when it printed none)."""
        self.count("cli runs")
        rc = proc.returncode
        if rc == 3 or rc == 124:
            return  # the daemon was away longer than --reconnect-timeout (or stopped)
        if rc == 0 and states and all(s == "COMPLETED" for s in states):
            return
        if rc == 1 and states and any(s in ("FAILED", "CANCELLED") for s in states):
            return
        if rc == 1 and not states:
            return  # refused, e.g. a full state disk: checked by its reason
        self.violate("exit code", f"{what} exited {rc} with states {states}: "
                                  f"{proc.stderr.strip()[-300:]}")

    def check_failed(self, tid, error, start, end):
        kind = reason_kind(error) if error else "(no reason)"
        with self.lock:
            self.failed_reasons[kind] = self.failed_reasons.get(kind, 0) + 1
        if not error:
            self.violate("failed reason", f"{tid} FAILED without a reason")
        elif not self.fault_during(start, end) and kind != "source changed":
            self.violate("failed reason", f"{tid} FAILED while no fault was in force: {error}")

    def verify_destination(self, what, path, version, layout):
        """A COMPLETED destination must hold exactly `version`."""
        found = lh.which_version(path, {version: expected_version(version, layout)})
        self.count("destinations verified")
        if found != version:
            self.violate("completed destination", f"{what}: {path} should be v{version}, "
                                                  f"holds {found}")
            return False
        return True

    # -- daemons --------------------------------------------------------
    def check_exits(self, daemons):
        for d in daemons:
            for pid, code, expected in d.exits:
                if not expected:
                    self.violate("daemon exit", f"{d.site} (pid {pid}) exited {code} without "
                                                f"the nemesis; log:\n{d.log_tail()}")
            if d.proc is not None and d.proc.poll() is not None and not d.exits[-1:]:
                self.violate("daemon exit", f"{d.site} exited {d.proc.returncode} unseen")

    def check_logs(self, daemons):
        for d in daemons:
            with open(d.log_path, errors="replace") as f:
                text = f.read()
            lines = [line for line in text.splitlines() if CRASH_MARKERS.search(line)]
            for line in lines[:3]:
                self.violate("daemon log", f"{d.site}: {line[:300]}")


def expected_version(version, layout):
    return {rel: lh.version_content(version, rel, size) for rel, size in layout.items()}


def resources(pid):
    """(open descriptors, threads) of a live process."""
    return len(os.listdir(f"/proc/{pid}/fd")), lh.proc_status(pid, "Threads")


class _LazyVersions(dict):
    """Every version of `layout`, built on demand: the watcher needs a
    version's file names only."""

    def __init__(self, layout):
        super().__init__()
        self.layout = layout

    def __missing__(self, version):
        return self.layout


class _OwnerByContent:
    """Tells which version a file's bytes belong to from their first line
    (`longhaul-test version V file REL`), and checks the rest of them."""
    LINE = re.compile(rb"longhaul-test version (\d+) file ")

    def __init__(self, layout):
        self.layout = layout

    def get(self, key):
        rel, data = key
        found = self.LINE.match(data)
        if not found or rel not in self.layout:
            return None
        version = int(found.group(1))
        return version if data == lh.version_content(version, rel, self.layout[rel]) else None


class WholeVersionWatcher(lh.VersionWatcher):
    """lh.VersionWatcher over any version of `layout`, not a fixed set."""

    def __init__(self, dest, layout, existed=False):
        super().__init__(dest, {}, existed)
        self.versions = _LazyVersions(layout)
        self._owner = _OwnerByContent(layout)

    interval = 0.0  # seconds between observations, to leave the cores to the daemons

    def run(self):
        while not self.stop_event.is_set():
            self.observe_guarded()
            if self.interval:
                self.stop_event.wait(self.interval)

    def observe_once(self):
        self._observe()
