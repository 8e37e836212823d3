#!/usr/bin/python3
"""A seeded fault campaign against three longhaul sites (see README.md).

    campaign.py --minutes 3 --seed 1 [--transport tcp|udp] [--json PATH]

Phases: start the sites; a fault-free warm-up round (every activity must
complete), then the baseline of descriptors and threads; the workload and
the nemesis for --minutes; the nemesis heals and stops; every transfer must
end; a fault-free final round must complete and verify; staging,
descriptors and threads must be back; the daemons must exit cleanly on
SIGTERM. Exits 1 on any violation, after printing the seed and the command
that replays it.
"""

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time

import checker
import nemesis
import summary
import topology
import workload

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import lh  # noqa: E402

END_WAIT_S = 120  # after the workload has waited for its own transfers


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--transport", choices=("tcp", "udp"), default="tcp")
    p.add_argument("--json", default="", help="where to write the summary (default: print only)")
    p.add_argument("--dir", default="", help="run directory (default: a new one under /tmp)")
    p.add_argument("--keep", action="store_true", help="keep the run directory")
    p.add_argument("--no-emulator", action="store_true",
                   help="sites on loopback; skips link cuts, partitions and loss")
    p.add_argument("--kinds", default="", help="comma-separated fault kinds (default: all)")
    return p.parse_args(argv)


def active_transfers(topo):
    """Every transfer not yet ended, at every site: [(site, status)]."""
    out = []
    for d in topo.daemons.values():
        proc = d.cli("ls", "--all", "--json", timeout=60)
        try:
            listed = json.loads(proc.stdout)["transfers"]
        except (ValueError, KeyError):
            out.append((d.site, {"id": "?", "state": f"ls failed: {proc.stderr.strip()}"}))
            continue
        out += [(d.site, t) for t in listed if t["state"] not in checker.END_STATES]
    return out


def wait_all_ended(topo, ledger, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        left = active_transfers(topo)
        if not left:
            return
        time.sleep(1)
    for site, t in left:
        ledger.violate("transfer ends", f"{t['id']} at {site} still {t['state']} {timeout}s "
                                        f"after the last fault: {t.get('error', '')}")


def listed_end_states(topo, ledger):
    """End states of every transfer the sites list, each id once (a
    fan-out's destination ID.N counts as ID); a CANCELLED one must be one
    the operator cancelled."""
    states = {}
    for d in topo.daemons.values():
        proc = d.cli("ls", "--all", "--json", timeout=60)
        for t in json.loads(proc.stdout)["transfers"]:
            states.setdefault(t["id"].split(".")[0], t)
    by_state = {}
    for tid, t in states.items():
        by_state[t["state"]] = by_state.get(t["state"], 0) + 1
        if t["state"] == "CANCELLED" and "cancel_asked" not in ledger.transfers.get(tid, {}):
            ledger.violate("transfer ends", f"{tid} CANCELLED, but nobody cancelled it: "
                                            f"{t.get('error', '')}")
    return by_state


def wait_idle(topo, ledger=None):
    """Until no site has a transfer that has not ended. After the run, one
    that never ends was flagged already: the checks go on without waiting."""
    try:
        lh.wait_until(lambda: not active_transfers(topo), 120, "every site idle", interval=0.5)
    except AssertionError:
        if ledger is None:
            raise


def measure(topo):
    return {s: checker.resources(d.pid) for s, d in topo.daemons.items()}


def check_resources(topo, ledger, baseline):
    """Staging empty and descriptors/threads within the margins of the
    baseline; polled for a while, since a daemon closes idle connections and
    ends idle workers on its own schedule."""
    def back():
        staged = {s: os.listdir(d.staging()) for s, d in topo.daemons.items()
                  if os.path.isdir(d.staging()) and os.listdir(d.staging())}
        now = measure(topo)
        over = {s: (now[s], baseline[s]) for s in now
                if now[s][0] > baseline[s][0] + checker.FD_MARGIN
                or now[s][1] > baseline[s][1] + checker.THREAD_MARGIN}
        return (staged, over, now)

    deadline = time.time() + 60
    while True:
        staged, over, now = back()
        if (not staged and not over) or time.time() > deadline:
            break
        time.sleep(1)
    for site, names in staged.items():
        ledger.violate("staging", f"{site} staging not empty after the final round: {names[:5]}")
    for site, (got, base) in over.items():
        ledger.violate("resources", f"{site} (fds, threads) {got}, baseline {base}, margins "
                                    f"+{checker.FD_MARGIN}/+{checker.THREAD_MARGIN}")
    return now


def run(args):
    ledger = checker.Ledger()
    run_dir = args.dir or tempfile.mkdtemp(prefix="lh-chaos-")
    os.makedirs(run_dir, exist_ok=True)
    kinds = [k for k in args.kinds.split(",") if k] or None
    topo = topology.Topology(run_dir, use_emulator=not args.no_emulator, seed=args.seed)
    baseline, final, end_states = {}, {}, {}
    started = time.time()
    wl = None
    try:
        topo.up()
        wl = workload.Workload(topo, ledger, args.seed,
                               transport=args.transport if args.transport != "tcp" else "")
        print(f"chaos: sites up in {run_dir}; warm-up round", flush=True)
        wl.warm_up()
        wait_idle(topo)
        baseline = measure(topo)
        wl.start()
        nem = nemesis.Nemesis(topo, ledger, args.seed, kinds)
        nem.start()
        print(f"chaos: workload and nemesis ({', '.join(sorted(nem.kinds))}) for "
              f"{args.minutes:g} min", flush=True)
        time.sleep(args.minutes * 60)
        print("chaos: stopping the nemesis (it heals what it holds)", flush=True)
        nem.stop()
        wl.stop()
        # The operator's last pass: nothing stays paused by a fault.
        nem.resume_paused(lambda t: True)
        wait_all_ended(topo, ledger, END_WAIT_S)
        end_states = listed_end_states(topo, ledger)
        print("chaos: fault-free final round", flush=True)
        wl.write_step()
        wl.round("final")
        wl.stop_watchers()
        for w in wl.watchers:
            for n, what in w.violations[:5]:
                ledger.violate("whole-version read", f"{w.dest} observation {n}: {what}")
        wait_idle(topo, ledger)
        final = check_resources(topo, ledger, baseline)
        for d in topo.daemons.values():
            code = d.terminate()
            if code != 0:
                ledger.violate("daemon exit", f"{d.site} exited {code} on SIGTERM:\n{d.log_tail()}")
        ledger.check_exits(topo.daemons.values())
        ledger.check_logs(topo.daemons.values())
    except Exception:  # noqa: BLE001 - the run fails with its seed printed
        import traceback
        ledger.violate("campaign", traceback.format_exc()[-2000:])
    finally:
        if wl is not None:
            wl.stop_event.set()
            for w in wl.watchers:
                if w.is_alive():
                    w.stop()
        topo.cleanup()
        if not args.keep and not ledger.violations:
            shutil.rmtree(run_dir, ignore_errors=True)
    result = summary.build(args, ledger, topo, time.time() - started, baseline, final, end_states)
    if args.json:
        summary.write(args.json, result)
    print(summary.text(result), flush=True)
    if ledger.violations:
        print(f"chaos: run directory kept: {run_dir}", flush=True)
    return 1 if ledger.violations else 0


if __name__ == "__main__":
    # SIGTERM (ctest's timeout, an operator) ends the run through its cleanup:
    # daemons, emulator, mounts and the run directory.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    sys.exit(run(parse_args(sys.argv[1:])))
