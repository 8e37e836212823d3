#!/usr/bin/python3
"""DiLoCo across two sites through longhaul.

Two sites (site-a, site-b), each with its own longhauld, each train the same
small model on their own data for H inner steps (AdamW), then all-reduce
their pseudo-gradients (start-of-round parameters minus local parameters)
through longhaul and take an outer Nesterov-SGD step with the average. The
all-reduce gives both sites the same bits, so after every outer step the two
models are identical.

    /usr/bin/python3 examples/diloco_two_sites.py [--outer-steps 4] [--inner-steps 20]

Starts two local daemons with deploy/local-sites.sh (or uses
LONGHAUL_SITE_A / LONGHAUL_SITE_B if set), runs one worker process per site,
and checks that both end with identical parameters. Needs `import longhaul`
(build/python on PYTHONPATH) and torch.

Environment: LONGHAUL_SITE_A / LONGHAUL_SITE_B (control addresses, e.g.
unix:/run/longhaul/control.sock, of running daemons to use instead of
starting two; one per site of --sites); PYTHONPATH (where `import longhaul`
is); LONGHAUL_BIN (the longhauld to start, default build/bin);
LONGHAUL_SOURCE_DIR (the repository, default this file's).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def make_model(torch):
    torch.manual_seed(0)  # the same initial parameters at every site
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))


def worker(args):
    import torch
    import longhaul

    site_index = args.sites.index(args.site)
    model = make_model(torch)
    params = [p for p in model.parameters()]
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    # Each site sees its own shard of one regression task.
    gen = torch.Generator().manual_seed(100 + site_index)
    true_w = torch.randn(16, 1, generator=torch.Generator().manual_seed(7))
    x = torch.randn(512, 16, generator=gen)
    y = torch.tanh(x @ true_w) + 0.05 * torch.randn(512, 1, generator=gen)

    group = longhaul.ExchangeGroup(args.address, "diloco-" + args.run, args.sites, timeout=60.0)
    # One flat float32 buffer for every pseudo-gradient: one all-reduce per round.
    flat = torch.zeros(sum(p.numel() for p in params), dtype=torch.float32)
    losses = []
    for step in range(args.outer_steps):
        start = [p.detach().clone() for p in params]
        for i in range(args.inner_steps):
            idx = torch.randint(0, x.shape[0], (32,), generator=gen)
            loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
            inner.zero_grad()
            loss.backward()
            inner.step()
        losses.append(float(torch.nn.functional.mse_loss(model(x), y)))
        # Pseudo-gradient, averaged across sites in place (no copy through Python).
        offset = 0
        with torch.no_grad():
            for p, s in zip(params, start):
                n = p.numel()
                flat[offset:offset + n].copy_((s - p).reshape(-1))
                offset += n
        group.allreduce(flat, op="avg", tag="outer-%d" % step, timeout=60.0)
        with torch.no_grad():
            offset = 0
            for p, s in zip(params, start):
                n = p.numel()
                p.copy_(s)  # back to the round's global parameters
                p.grad = flat[offset:offset + n].view_as(p).clone()
                offset += n
        outer.step()
        outer.zero_grad()
        print("%s outer step %d: local loss %.4f" % (args.site, step, losses[-1]), flush=True)
    group.close()
    torch.save({k: v for k, v in model.state_dict().items()}, args.out)
    with open(args.out + ".json", "w") as f:
        json.dump({"losses": losses}, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outer-steps", type=int, default=4)
    parser.add_argument("--inner-steps", type=int, default=20)
    parser.add_argument("--site")
    parser.add_argument("--address")
    parser.add_argument("--out")
    parser.add_argument("--run", default=str(os.getpid()))
    parser.add_argument("--sites", nargs="+", default=["site-a", "site-b"])
    args = parser.parse_args()
    if args.site:
        worker(args)
        return 0

    import torch
    from local_sites import LocalSites

    with tempfile.TemporaryDirectory(prefix="diloco-") as tmp, LocalSites(args.sites) as sites:
        procs = {}
        try:
            for site in args.sites:
                cmd = [sys.executable, os.path.abspath(__file__), "--site", site,
                       "--address", sites.address(site), "--out", os.path.join(tmp, site + ".pt"),
                       "--run", args.run, "--outer-steps", str(args.outer_steps),
                       "--inner-steps", str(args.inner_steps), "--sites", *args.sites]
                procs[site] = subprocess.Popen(cmd)
            codes = {site: p.wait(timeout=600) for site, p in procs.items()}
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
        if any(codes.values()):
            print("workers failed: %s" % codes, file=sys.stderr)
            return 1
        states = {s: torch.load(os.path.join(tmp, s + ".pt")) for s in args.sites}
        first = states[args.sites[0]]
        for site, state in states.items():
            for name, tensor in first.items():
                if not torch.equal(tensor, state[name]):
                    print("parameter %s differs between %s and %s" % (name, args.sites[0], site),
                          file=sys.stderr)
                    return 1
        with open(os.path.join(tmp, args.sites[0] + ".pt.json")) as f:
            losses = json.load(f)["losses"]
        print("identical parameters at %s after %d outer steps (site-a loss %.4f -> %.4f)" %
              (", ".join(args.sites), args.outer_steps, losses[0], losses[-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
