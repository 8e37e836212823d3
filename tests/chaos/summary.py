"""The campaign's figures: as JSON (for the README's tables and for CI
artifacts) and as the text printed at the end of a run."""

import datetime
import json


def build(args, ledger, topo, elapsed_s, baseline, final_resources, end_states):
    watchers = ledger.watchers
    return {
        "seed": args.seed,
        "minutes": args.minutes,
        "transport": args.transport,
        "elapsed_s": round(elapsed_s, 1),
        "replay": replay_command(args),
        "faults_by_kind": dict(sorted(ledger.faults_by_kind.items())),
        "faults_total": sum(ledger.faults_by_kind.values()),
        "skipped_faults": dict(sorted(topo.skipped.items())),
        "skipped_workload": dict(sorted(ledger.skipped_workload.items())),
        "transfers_by_end_state": dict(sorted(end_states.items())),
        "failed_reasons": dict(sorted(ledger.failed_reasons.items())),
        "allreduce": ledger.allreduce,
        "whole_version_reads": sum(w.complete for w in watchers),
        "reads_straddling_a_change": sum(w.incomplete for w in watchers),
        "versions_seen_by_readers": sum(len(w.seen) for w in watchers),
        "counts": dict(sorted(ledger.counts.items())),
        "resources": {"baseline": baseline, "final": final_resources},
        "violations": [{"check": c, "detail": d} for c, d in ledger.violations],
        # The schedule, for reading the daemons' logs beside it.
        "fault_timeline": [{"kind": k, "site": s, "start": _utc(a), "healed": _utc(b)}
                           for k, s, a, b in ledger.faults],
    }


def replay_command(args):
    extra = (" --no-emulator" if args.no_emulator else "") + \
        (f" --kinds {args.kinds}" if args.kinds else "")
    return (f"tests/chaos/run.sh --minutes {args.minutes:g} --seed {args.seed} "
            f"--transport {args.transport}{extra}")


def write(path, summary):
    with open(path, "w") as f:
        json.dump(summary, f, indent=2, sort_keys=False)
        f.write("\n")


def text(summary):
    lines = [f"chaos campaign: seed {summary['seed']}, {summary['minutes']:g} min, "
             f"transport {summary['transport']}, {summary['elapsed_s']:.0f} s",
             f"  faults injected: {summary['faults_total']} "
             f"{_pairs(summary['faults_by_kind'])}"]
    for kind, why in summary["skipped_faults"].items():
        lines.append(f"  fault {kind} skipped: {why}")
    for what, why in summary["skipped_workload"].items():
        lines.append(f"  workload {what} skipped: {why}")
    lines += [f"  transfers by end state: {_pairs(summary['transfers_by_end_state'])}",
              f"  FAILED reasons: {_pairs(summary['failed_reasons'])}",
              f"  all-reduce groups: {summary['allreduce']['ok']} ok, "
              f"{summary['allreduce']['failed']} failed "
              f"{_pairs(summary['allreduce']['reasons'])}",
              f"  whole-version reads checked: {summary['whole_version_reads']} "
              f"({summary['reads_straddling_a_change']} straddled a publish and were retried)",
              f"  counts: {_pairs(summary['counts'])}",
              f"  resources (fds, threads) baseline {summary['resources']['baseline']} "
              f"final {summary['resources']['final']}",
              f"  violations: {len(summary['violations'])}"]
    for v in summary["violations"][:50]:
        lines.append(f"    [{v['check']}] {v['detail']}")
    if summary["violations"]:
        lines += [f"FAILED: seed {summary['seed']}; replay with:", f"  {summary['replay']}"]
    return "\n".join(lines)


def _pairs(d):
    return "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"


def _utc(t):
    if t is None:
        return None
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%H:%M:%S.%f")[:-3]
