#!/usr/bin/python3
"""DiLoCo across three sites through longhaul.torch, surviving a lost site.

Three sites (site-a, site-b, site-c), each with its own longhauld, train the
same small model on their own data: a few inner SGD steps, then an outer
step (longhaul.torch.OuterStep: bucketed AVG all-reduces of the
pseudo-gradients, then Nesterov SGD), with the outer step's all-reduces
overlapping the next inner steps (--no-overlap turns that off).

Mid-run, site-c stops after --kill-after outer steps and this script
SIGKILLs its worker and its daemon while site-a and site-b wait for it in
the next all-reduce. They get longhaul.PeerLostError, retry the round on two
sites, and carry on. The script restarts site-c's daemon and worker; at the
start of outer step --rejoin-at the survivors re-Join with all three sites,
site-a sends site-c the current state (global parameters, outer optimizer,
round), and the three finish together. The script then checks that all
three sites end with bit-identical parameters (SHA-256 of their bytes) and
exits 1 otherwise.

    /usr/bin/python3 examples/diloco_sites.py [--outer-steps 6] [--inner-steps 8]

Starts the daemons with deploy/local-sites.sh in a temporary directory and
stops them, the workers and the directory on every exit (it kills and
restarts a site, so it never uses daemons named by LONGHAUL_SITE_*). Needs
`import longhaul` (build/python on PYTHONPATH) and torch.

Environment: PYTHONPATH (where `import longhaul` is, e.g. build/python);
LONGHAUL_BIN (the longhauld that deploy/local-sites.sh starts, default
build/bin); LONGHAUL_SOURCE_DIR (the repository, default this file's).
"""

import argparse
import ctypes
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SITES = ["site-a", "site-b", "site-c"]


def log(site, msg):
    print("%s: %s" % (site, msg), flush=True)


def make_model(torch):
    torch.manual_seed(0)  # the same initial parameters at every site
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))


def params_sha256(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def worker(args):
    import torch

    import longhaul
    import longhaul.torch as lht

    torch.set_num_threads(1)
    me = args.site
    model = make_model(torch)
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    # Each site sees its own shard of one regression task.
    gen = torch.Generator().manual_seed(100 + SITES.index(me))
    true_w = torch.randn(16, 1, generator=torch.Generator().manual_seed(7))
    x = torch.randn(512, 16, generator=gen)
    y = torch.tanh(x @ true_w) + 0.05 * torch.randn(512, 1, generator=gen)

    # A re-join uses a group name of its own: a peer's JOIN that reaches a
    # daemon before this site has closed its old group of the same name is
    # lost there, and that re-Join then forms at the peer but times out here.
    name = "diloco-%s-%d" % (args.run, args.rejoin_at if args.rejoin else 0)
    group = longhaul.ExchangeGroup(args.address, name, SITES, timeout=120.0)
    step = lht.OuterStep(group, model, outer, bucket_bytes=args.bucket_bytes, timeout=120.0)
    log(me, "joined at generation %d; %d parameters in buckets of %s bytes" %
        (group.generation, sum(p.numel() for p in model.parameters()), step.buckets.bucket_bytes()))
    if args.rejoin:
        donor = sorted(s for s in SITES if s != me)[0]
        step.load_state_dict(lht.recv_object(group, donor, "state", timeout=120.0))
        log(me, "restarted: took round %d's state from %s" % (step.round, donor))

    pending = None  # the Handle of an outer step overlapping the inner steps
    lost = []
    while True:
        try:
            if pending is not None and step.round + 1 in (args.kill_after, args.rejoin_at,
                                                          args.outer_steps):
                # Finish the step in flight before a boundary everybody must see alike.
                handle, pending = pending, None
                handle.wait()
                continue
            if pending is None and step.round >= args.outer_steps:
                break
            if pending is None and me == args.kill_site and step.round == args.kill_after \
                    and not args.rejoin:
                log(me, "stopping after %d outer steps; waiting to be killed" % step.round)
                open(os.path.join(args.dir, me + ".parked"), "w").close()
                while True:
                    time.sleep(60)
            if pending is None and step.round == args.rejoin_at and group.members != SITES:
                old = group.members
                log(me, "re-joining with %s at round %d" % (SITES, step.round))
                group.close()
                name = "diloco-%s-%d" % (args.run, step.round)
                group = longhaul.ExchangeGroup(args.address, name, SITES, timeout=120.0)
                step.group = group
                log(me, "re-joined at generation %d" % group.generation)
                if me == min(old):
                    for joiner in sorted(set(SITES) - set(old)):
                        lht.send_object(group, joiner, "state", step.state_dict(), timeout=120.0)
            for _ in range(args.inner_steps):
                idx = torch.randint(0, x.shape[0], (32,), generator=gen)
                loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
                inner.zero_grad()
                loss.backward()
                inner.step()
            if pending is not None:
                handle, pending = pending, None
                handle.wait()
            with torch.no_grad():
                loss = float(torch.nn.functional.mse_loss(model(x), y))
            overlap = args.overlap and step.round + 1 < args.outer_steps
            pending = step.step(async_op=overlap) if overlap else step.step()
            log(me, "outer step %d%s: local loss %.4f, %d sites" %
                (step.round if pending is None else step.round + 1,
                 " (in flight)" if pending else "", loss, len(group.members)))
        except longhaul.PeerLostError as e:
            pending = None
            lost.append(e.peer)
            log(me, "lost %s in outer step %d (retryable=%s); going on with %s" %
                (e.peer, step.round + 1, e.retryable, group.members))
    digest = params_sha256(step.global_parameters())
    if params_sha256(model.parameters()) != digest:
        raise AssertionError("the model's parameters are not the global ones")
    group.close()
    with open(os.path.join(args.dir, me + ".json"), "w") as f:
        json.dump({"sha256": digest, "rounds": step.round, "lost": lost}, f)
    log(me, "done: %d outer steps, parameters sha256 %s" % (step.round, digest[:16]))


def _die_with_parent():
    # A worker must not outlive this script, whatever kills it.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outer-steps", type=int, default=6)
    parser.add_argument("--inner-steps", type=int, default=8)
    parser.add_argument("--kill-site", default="site-c")
    parser.add_argument("--kill-after", type=int, default=2,
                        help="outer steps the killed site does before it dies")
    parser.add_argument("--rejoin-at", type=int, default=4,
                        help="the outer step at whose start the restarted site re-joins")
    parser.add_argument("--bucket-bytes", type=int, default=2048)
    parser.add_argument("--no-overlap", dest="overlap", action="store_false")
    parser.add_argument("--site")
    parser.add_argument("--address")
    parser.add_argument("--dir")
    parser.add_argument("--rejoin", action="store_true")
    parser.add_argument("--run", default=str(os.getpid()))
    args = parser.parse_args()
    if not (0 < args.kill_after and args.kill_after + 2 <= args.rejoin_at < args.outer_steps):
        parser.error("need 0 < --kill-after, --kill-after + 2 <= --rejoin-at < --outer-steps")
    if args.site:
        worker(args)
        return 0

    from local_sites import LocalSites

    # SIGTERM unwinds like Ctrl-C, so the cleanup below runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    procs = []
    with tempfile.TemporaryDirectory(prefix="diloco-sites-") as tmp, LocalSites(SITES, use_environment=False) as sites:

        def spawn(site, rejoin=False):
            cmd = [sys.executable, os.path.abspath(__file__), "--site", site,
                   "--address", sites.address(site), "--dir", tmp, "--run", args.run,
                   "--outer-steps", str(args.outer_steps), "--inner-steps", str(args.inner_steps),
                   "--kill-site", args.kill_site, "--kill-after", str(args.kill_after),
                   "--rejoin-at", str(args.rejoin_at), "--bucket-bytes", str(args.bucket_bytes)]
            cmd += ([] if args.overlap else ["--no-overlap"]) + (["--rejoin"] if rejoin else [])
            p = subprocess.Popen(cmd, preexec_fn=_die_with_parent)
            procs.append(p)
            return p

        try:
            workers = {s: spawn(s) for s in SITES}
            victim = workers[args.kill_site]
            parked = os.path.join(tmp, args.kill_site + ".parked")
            deadline = time.monotonic() + 120
            while not os.path.exists(parked):
                if time.monotonic() > deadline or any(p.poll() for p in workers.values()):
                    print("%s never reached outer step %d" % (args.kill_site, args.kill_after),
                          file=sys.stderr)
                    return 1
                time.sleep(0.05)
            time.sleep(1.0)  # the others are now waiting for it in the next all-reduce
            print("killing %s's worker and daemon (SIGKILL)" % args.kill_site, flush=True)
            victim.kill()
            victim.wait()
            sites.kill(args.kill_site)
            time.sleep(0.5)
            print("restarting %s" % args.kill_site, flush=True)
            sites.restart(args.kill_site)
            workers[args.kill_site] = spawn(args.kill_site, rejoin=True)
            codes = {s: p.wait(timeout=300) for s, p in workers.items()}
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(codes.values()):
            print("workers failed: %s" % codes, file=sys.stderr)
            return 1
        results = {}
        for s in SITES:
            with open(os.path.join(tmp, s + ".json")) as f:
                results[s] = json.load(f)
        digests = {s: r["sha256"] for s, r in results.items()}
        if len(set(digests.values())) != 1:
            print("parameters differ between sites: %s" % digests, file=sys.stderr)
            return 1
        if not all(args.kill_site in results[s]["lost"] or s == args.kill_site for s in SITES):
            print("warning: a survivor never saw %s lost mid-operation: %s" %
                  (args.kill_site, {s: r["lost"] for s, r in results.items()}))
        print("identical parameters at %s after %d outer steps (sha256 %s); %s was killed "
              "after %d and re-joined at %d" % (", ".join(SITES), args.outer_steps,
                                                digests[SITES[0]][:16], args.kill_site,
                                                args.kill_after, args.rejoin_at))
    return 0


if __name__ == "__main__":
    sys.exit(main())
