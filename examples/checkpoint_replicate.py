#!/usr/bin/python3
"""Replicate a sharded PyTorch checkpoint from site-a to site-b with longhaul.

site-a trains a small model a few steps, then saves the model and its
optimizer state as several torch.save shards plus `model.index.json`, the
commit marker (longhauld publishes `*.index.json` last, so a reader that
sees the index sees every shard). The client API copies the directory to
site-b; site-b loads it back and every tensor must be equal.

    /usr/bin/python3 examples/checkpoint_replicate.py [--shards 4] [--hidden 256]

(torch.distributed.checkpoint is not usable with Debian's torch 1.13 under
Python 3.11, hence plain torch.save shards and an index.)
Environment:
  LONGHAUL_SITE_A, LONGHAUL_SITE_B  control addresses of running daemons
      (e.g. unix:/run/longhaul/control.sock) to use instead of starting two
      local ones with deploy/local-sites.sh. Sites that
      `eval "$(deploy/local-sites.sh up DIR)"` exported need nothing more;
      for other daemons pass --source-dir (a directory inside one of site-a's
      exports: longhauld sends only from its exports) and --dest-dir (where
      site-b's `ckpt` export is on this host).
  PYTHONPATH            where `import longhaul` is (e.g. build/python).
  LONGHAUL_BIN          the longhauld that deploy/local-sites.sh starts
                        (default build/bin).
  LONGHAUL_SOURCE_DIR   the repository (default: this file's).
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def save_sharded(torch, model, optimizer, directory, shards):
    """Writes shard-NNNNN.pt files and model.index.json (last)."""
    os.makedirs(directory, exist_ok=True)
    state = {"model." + k: v for k, v in model.state_dict().items()}
    opt = optimizer.state_dict()
    for pid, s in opt["state"].items():
        for k, v in s.items():
            state["optim.state.%d.%s" % (pid, k)] = v
    names = sorted(state)
    index = {"format": "longhaul-example-sharded-v1", "shards": [], "weight_map": {},
             "optim_param_groups": opt["param_groups"]}
    for i in range(shards):
        part = {n: state[n] for n in names[i::shards]}
        fname = "shard-%05d-of-%05d.pt" % (i, shards)
        torch.save(part, os.path.join(directory, fname))
        index["shards"].append(fname)
        index["weight_map"].update({n: fname for n in part})
    with open(os.path.join(directory, "model.index.json"), "w") as f:
        json.dump(index, f, indent=1)
    return state


def load_sharded(torch, directory):
    with open(os.path.join(directory, "model.index.json")) as f:
        index = json.load(f)
    state = {}
    for fname in index["shards"]:
        state.update(torch.load(os.path.join(directory, fname)))
    missing = set(index["weight_map"]) - set(state)
    if missing:
        raise RuntimeError("checkpoint misses %s" % sorted(missing))
    return state


def find_index(root):
    for dirpath, _, files in os.walk(root):
        if "model.index.json" in files:
            return dirpath
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--dest-dir", help="site-b's ckpt export on this host (external daemons)")
    parser.add_argument("--source-dir", help="a directory inside one of site-a's exports (external daemons)")
    args = parser.parse_args()

    import torch
    import longhaul
    from local_sites import LocalSites

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):  # some optimizer state worth checking
        loss = model(torch.randn(32, 64)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    with LocalSites() as sites:
        try:
            source_parent = args.source_dir or sites.source_dir()
            dest_export = args.dest_dir or sites.export_dir("site-b")
        except RuntimeError as e:
            print("checkpoint_replicate: %s" % e, file=sys.stderr)
            return 2
        return replicate(args, torch, longhaul, model, optimizer, sites, source_parent, dest_export)


def replicate(args, torch, longhaul, model, optimizer, sites, source_parent, dest_export):
    with tempfile.TemporaryDirectory(prefix="ckpt-src-", dir=source_parent) as src:
        step_dir = os.path.join(src, "step-3")
        saved = save_sharded(torch, model, optimizer, step_dir, args.shards)
        client = longhaul.Client(sites.address("site-a"))
        run = "run-%d" % os.getpid()
        status = client.submit([step_dir], "site-b:/ckpt/%s/step-3" % run, request_id=run)
        updates = []
        final = client.wait(status["id"], timeout=300,
                            progress=lambda s: updates.append(int(s.get("bytes_done", 0))))
        if final["state"] != "COMPLETED":
            print("replication failed: %s" % final.get("error"), file=sys.stderr)
            return 1
        dest_root = os.path.join(dest_export, run)
        where = find_index(dest_root)
        if where is None:
            print("no model.index.json under %s" % dest_root, file=sys.stderr)
            return 1
        loaded = load_sharded(torch, where)
        if sorted(loaded) != sorted(saved):
            print("tensor names differ", file=sys.stderr)
            return 1
        for name, tensor in saved.items():
            if not torch.equal(tensor, loaded[name]):
                print("tensor %s differs at site-b" % name, file=sys.stderr)
                return 1
        print("replicated %d tensors in %d shards (%d bytes) to site-b in %.2fs; all equal "
              "(%d progress updates)" % (len(saved), args.shards, int(final["bytes_total"]),
                                         float(final["seconds"]), len(updates)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
