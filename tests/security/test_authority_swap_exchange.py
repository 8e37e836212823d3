"""The authority-swap harness for exchanges (ctest label `security`): every
exchange message kind of authority_catalogue.py, replayed by a non-member.

site-a and site-b form a group and record one round of their collectives
(all-reduce, all-gather, broadcast, send/recv). Then, for each kind in a
seeded order, site-c, a configured peer that is no member, sends that kind
for the group to both members, at the generation and sequence numbers of
the members' next round, with the tag their next send uses; the members run
the round again. Each round must give exactly the right results: no
non-member message is ever taken. site-b's export and transfer list stay
unchanged, and both daemons stay up.

Seeded like test_authority_swap.py: LONGHAUL_SWAP_SEED (default 1207) picks
the order of the kinds and their mutations (the generation, a root that is
not a member, the payload).
"""

import json
import os
import random
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import lh  # noqa: E402

import authority_catalogue as cat  # noqa: E402
import hostile_peer as hp  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(lh.BIN), "python"))
import longhaul  # noqa: E402

SEED = int(os.environ.get("LONGHAUL_SWAP_SEED", "1207"))
REPLAY = (f"cd tests/security && LONGHAUL_SWAP_SEED={SEED} LONGHAUL_BIN=<build>/bin "
          "/usr/bin/python3 -m unittest -v test_authority_swap_exchange")
GROUP = "g-swap"
MEMBERS = ["site-a", "site-b"]
COUNT = 1024  # float32 elements per member buffer
TAG = "swap-tag"
OPS_PER_ROUND = 3  # all-reduce, all-gather and broadcast share the group's op counter
KINDS = {"JOIN": 1, "REDUCE_DATA": 2, "ABORT": 3, "P2P": 4, "LEAVE": 5, "DISCARD": 6, "DONE": 7,
         "REFUSED": 8, "REDUCE_RESULT": 9, "GATHER_DATA": 10, "BCAST_DATA": 11}


def in_parallel(calls):
    """lh.in_parallel, raising the first exception any call raised."""
    return lh.raise_any(lh.in_parallel(calls))


class ExchangeSwapTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.sites = lh.Sites(names=("site-a", "site-b", "site-c"))
        try:
            cls.sites.up()
        except BaseException:
            cls.sites.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.sites.cleanup()

    def address(self, site):
        return self.sites.env["LONGHAUL_SITE_" + site[-1].upper()]

    def non_member(self, target):
        with open(self.sites.path(target, "longhauld.yaml")) as f:
            listen = [line for line in f if line.startswith("listen:")][0].split()[1]
        return hp.connect_exchange(hp.HostilePeer(self.sites.path("pki"), "site-c", listen,
                                                  target))

    def site_b_view(self):
        listed = json.loads(self.sites.cli("b", "ls", "--all", "--json", check=True).stdout)
        return lh.tree_digest(self.sites.export("site-b")), listed["transfers"]

    def round(self, groups, r):
        """One round of the members' collectives, numbered `r`; returns what
        each member got, to compare with what it must get."""
        bufs = [((k + 1) * np.arange(COUNT) + r).astype(np.float32) for k in range(2)]
        in_parallel([lambda k=k: groups[k].allreduce(bufs[k], timeout=60.0) for k in range(2)])
        gathered = in_parallel([lambda k=k: groups[k].allgather(
            np.full(COUNT, 10 * r + k, np.float32), timeout=60.0) for k in range(2)])
        cast = [np.full(COUNT, 7.0 + r, np.float32), np.zeros(COUNT, np.float32)]
        in_parallel([lambda k=k: groups[k].broadcast(cast[k], root="site-a", timeout=60.0)
                     for k in range(2)])
        message = np.frombuffer(f"round {r}".encode().ljust(64, b"."), np.uint8)
        out = np.zeros(256, np.uint8)
        groups[0].send("site-b", TAG, message)
        n = groups[1].recv("site-a", TAG, out)
        got = (bufs, gathered, cast, bytes(out[:n]))
        want_sum = (3 * np.arange(COUNT) + 2 * r).astype(np.float32)
        want = ([want_sum, want_sum],
                [np.concatenate([np.full(COUNT, 10 * r + k, np.float32) for k in range(2)])] * 2,
                [np.full(COUNT, 7.0 + r, np.float32)] * 2, message.tobytes())
        return got, want

    def assert_round(self, groups, r, what):
        got, want = self.round(groups, r)
        for name, g, w in zip(("all-reduce", "all-gather", "broadcast"), got[:3], want[:3]):
            for k in range(2):
                if not np.array_equal(g[k], w[k]):
                    self.fail(f"{what}: {MEMBERS[k]}'s {name} of round {r} took something else: "
                              f"{g[k][:4]}...\nseed {SEED}; replay with: {REPLAY}")
        self.assertEqual(got[3], want[3], f"{what}: the send of round {r}\nseed {SEED}")

    def replay(self, rng, kind, groups, r):
        """Sends, as site-c, one message of `kind` for the group to each
        member, aimed at round `r`; returns what it was."""
        generation = groups[0].generation + rng.choice([0, 0, 1])
        seq = r * OPS_PER_ROUND + {"GATHER_DATA": 1, "BCAST_DATA": 2}.get(kind, 0)
        payload = b""
        fields = [(1, KINDS[kind]), (2, GROUP), (3, generation), (5, seq), (6, TAG),
                  (7, 1), (8, 1), (12, "site-c replays"), (13, rng.randrange(1, 1 << 40)),
                  (14, rng.randrange(1, 1 << 40)), (17, rng.randrange(1, 1 << 40))]
        if kind == "JOIN":
            fields.append((4, sorted(MEMBERS + ["site-c"])))
        if kind in ("REDUCE_DATA", "REDUCE_RESULT", "GATHER_DATA", "BCAST_DATA", "P2P"):
            payload = np.full(COUNT, rng.choice([1000.0, -1.0, 0.5]), np.float32).tobytes()
            fields += [(9, COUNT if kind.startswith("REDUCE") else len(payload))]
        if kind == "BCAST_DATA":
            fields.append((20, rng.choice(["site-a", "site-c"])))
        fields += [(11, len(payload)), (15, 0), (16, len(payload))]
        header = hp.message(*fields)
        for target in MEMBERS:
            channel = self.non_member(target)
            try:
                channel.sock.sendall(hp._frame(hp.CONTROL, header) + payload)
                self.assertTrue(hp.end_exchange(channel), f"{target} did not read site-c's {kind}")
            finally:
                channel.close()
        return f"exchange.{kind} from site-c at generation {generation}, seq {seq}"

    def test_every_exchange_kind_replayed_by_a_non_member(self):
        rng = random.Random(SEED)
        kinds = [op.proto.split(".")[1] for op in cat.CATALOGUE if op.kind == cat.EXCHANGE_KIND]
        self.assertEqual(sorted(kinds), sorted(KINDS), "a catalogued kind the harness cannot send")
        for kind in kinds:
            self.assertEqual(cat.BY_NAME[f"exchange.{kind}"].replays, {cat.NON_MEMBER: cat.REFUSED})
        rng.shuffle(kinds)
        groups = in_parallel([lambda s=s: longhaul.ExchangeGroup(self.address(s), GROUP, MEMBERS,
                                                                 timeout=30.0) for s in MEMBERS])
        self.addCleanup(lambda: [g.close() for g in groups])
        # The legitimate interaction: one round of the members' own.
        self.assert_round(groups, 0, "the members' own round")
        before = self.site_b_view()
        for r, kind in enumerate(kinds, start=1):
            what = self.replay(rng, kind, groups, r)
            self.assert_round(groups, r, what)
            self.assertEqual(self.site_b_view(), before, what)
            for site in MEMBERS:
                self.assertTrue(lh.process_alive(self.sites.pid(site)), f"{what}: {site} died")
        print(f"authority swap (exchange): {len(kinds)} kinds replayed, seed {SEED}",
              file=sys.stderr)


if __name__ == "__main__":
    unittest.main()
