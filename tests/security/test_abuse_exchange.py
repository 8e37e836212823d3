"""Exchange abuse (ctest label `security`): site-c, a configured peer with a
valid certificate but no member of site-a + site-b's group, speaks exchange
frames to their daemons (hostile_peer.py). Its ABORTs, DONEs, data and JOINs
for the group, planted before the group forms and after, do not affect the
members' all-reduces, which complete with the right sum. Its flood of
messages no call asks for (4 MiB and zero-byte ones) is refused past
peer_limits.max_unclaimed_messages_per_peer and peer_limits.memory_per_peer:
the daemon stays up, its peak RSS stays within the budget, and a transfer
and an all-reduce run during the flood complete."""

import json
import os
import sys
import threading
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import lh  # noqa: E402

import hostile_peer as hp  # noqa: E402

# The binding (`import longhaul`) is built next to the binaries.
sys.path.insert(0, os.path.join(os.path.dirname(lh.BIN), "python"))
import longhaul  # noqa: E402

MIB = 1 << 20
MEMORY_PER_PEER = 128 * MIB
MAX_UNCLAIMED = 64
EXTRA = (f"peer_limits:\n  memory_per_peer: {MEMORY_PER_PEER // MIB}MiB\n"
         f"  max_unclaimed_messages_per_peer: {MAX_UNCLAIMED}\n")
# Room above the budget for what else runs during the flood (the transfer's
# chunk buffers, the all-reduce, allocator slack); far below the 600 MiB the
# flood sends.
ALLOWANCE = 160 * MIB
COUNT = 4096  # floats per all-reduce




class ExchangeAbuseTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sites = lh.Sites(extra_config=EXTRA, names=("site-a", "site-b", "site-c"))
        try:
            cls.sites.up()
        except BaseException:
            cls.sites.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.sites.cleanup()

    def setUp(self):
        self.next_id = 1
        self.groups = []
        self.addCleanup(self.close_groups)

    def close_groups(self):
        for g in self.groups:
            g.close()

    def address(self, site):
        return self.sites.env["LONGHAUL_SITE_" + site[-1].upper()]

    def hostile(self, target):
        """An EXCHANGE channel from site-c (hostile) to `target`'s daemon."""
        with open(self.sites.path(target, "longhauld.yaml")) as f:
            listen = [line for line in f if line.startswith("listen:")][0].split()[1]
        peer = hp.HostilePeer(self.sites.path("pki"), "site-c", listen, target)
        channel = hp.connect_exchange(peer)
        self.addCleanup(channel.close)
        return channel

    def send(self, channel, kind, payload=b"", **fields):
        hp.send_exchange(channel, self.next_id, kind, payload, **fields)
        self.next_id += 1

    def join(self, name, members):
        results = [None] * len(members)

        def run(i):
            try:
                results[i] = longhaul.ExchangeGroup(self.address(members[i]), name, members,
                                                    timeout=30.0)
            except BaseException as e:  # noqa: B902 - raised below
                results[i] = e

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(members))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        self.groups += results
        return results

    def allreduce(self, groups, seq):
        """One all-reduce at every group; each site k passes (k+1)*i + seq.
        Returns the error of each site (None if it succeeded)."""
        bufs = [((k + 1) * np.arange(COUNT) + seq).astype(np.float32) for k in range(len(groups))]
        errors = [None] * len(groups)

        def run(k):
            try:
                groups[k].allreduce(bufs[k], timeout=60.0)
            except BaseException as e:  # noqa: B902 - reported
                errors[k] = e

        threads = [threading.Thread(target=run, args=(k,)) for k in range(len(groups))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        want = (sum(range(1, len(groups) + 1)) * np.arange(COUNT) + len(groups) * seq)
        for k, b in enumerate(bufs):
            if errors[k] is None and not np.array_equal(b, want.astype(np.float32)):
                errors[k] = AssertionError(f"site {k} got a wrong sum: {b[:4]}...")
        return errors

    def plant(self, channel, group):
        """What site-c plants for all-reduces #0-3 of `group`: at each of
        generations 0-3 an ABORT, a DONE and a contribution of 1000s, and a
        JOIN naming itself."""
        junk = np.full(COUNT, 1000.0, np.float32).tobytes()
        for seq in range(4):
            for gen in range(4):
                common = dict(group=group, seq=seq, generation=gen)
                self.send(channel, hp.EX_ABORT, reason="site-c says stop", **common)
                self.send(channel, hp.EX_DONE, **common)
                self.send(channel, hp.EX_REDUCE_DATA, junk, dtype=hp.EX_FLOAT32, op=hp.EX_SUM,
                          count=COUNT, **common)
        self.send(channel, hp.EX_JOIN, group=group, generation=9,
                  members=["site-a", "site-b", "site-c"])

    def test_non_member_cannot_fail_the_members_all_reduce(self):
        members = ["site-a", "site-b"]
        for m in members:
            channel = self.hostile(m)
            self.plant(channel, "g-members")
            self.assertTrue(hp.end_exchange(channel), f"{m} did not read site-c's messages")
        groups = self.join("g-members", members)
        for m in members:
            channel = self.hostile(m)
            self.plant(channel, "g-members")
            self.assertTrue(hp.end_exchange(channel), f"{m} did not read site-c's messages")
        for seq in range(4):
            errors = self.allreduce(groups, seq)
            self.assertEqual(errors, [None, None], f"all-reduce #{seq}")
        for m in members:
            self.assertTrue(lh.process_alive(self.sites.pid(m)), m)

    def test_flood_of_unclaimed_messages_is_refused_and_memory_stays_bounded(self):
        pid = self.sites.pid("site-b")
        peak_before = lh.proc_status(pid, "VmHWM") * 1024
        groups = self.join("g-flood", ["site-a", "site-b"])
        src = self.sites.path("flood-src.bin")
        lh.write_random(src, 48 * MIB, seed=5)

        flood_done = threading.Event()
        flood_error = []

        def flood():
            try:
                channel = self.hostile("site-b")
                block = os.urandom(4 * MIB)
                for i in range(150):  # 600 MiB no call asks for
                    self.send(channel, hp.EX_P2P, block, group="nobody", tag=f"big-{i}")
                for i in range(20000):
                    self.send(channel, hp.EX_P2P, group="nobody", tag=f"empty-{i}")
                if not hp.end_exchange(channel):
                    flood_error.append("site-b did not read the flood")
            except BaseException as e:  # noqa: B902 - reported below
                flood_error.append(repr(e))
            finally:
                flood_done.set()

        flooder = threading.Thread(target=flood)
        flooder.start()
        proc, result = self.sites.cp(src, "site-b:/ckpt/during-flood.bin", "--chunk-size", "8MiB")
        errors = self.allreduce(groups, 0)
        flooder.join(240)
        self.assertTrue(flood_done.is_set(), "the flood did not finish")
        self.assertEqual(flood_error, [])

        self.assertTrue(lh.process_alive(pid), "site-b died")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(result["state"], "COMPLETED")
        verify = self.sites.cli("a", "verify", result["id"], "--json")
        self.assertEqual(verify.returncode, 0, verify.stdout + verify.stderr)
        self.assertTrue(json.loads(verify.stdout)["ok"])
        self.assertEqual(errors, [None, None])
        # An all-reduce after the flood too: site-c's unclaimed messages
        # take nothing from site-a's.
        self.assertEqual(self.allreduce(groups, 1), [None, None])

        peak = lh.proc_status(pid, "VmHWM") * 1024
        self.assertLessEqual(peak - peak_before, MEMORY_PER_PEER + ALLOWANCE,
                             f"site-b's peak RSS grew from {peak_before >> 20} to {peak >> 20} MiB")
        log = self.sites.log("site-b")
        self.assertIn("refused", log)
        self.assertRegex(log, r"refused \d+ message\(s\) from site-c: .*memory_per_peer")
        self.assertRegex(log, r"refused \d+ message\(s\) from site-c: site-b already holds "
                              rf"{MAX_UNCLAIMED} exchange messages from site-c .*"
                              r"max_unclaimed_messages_per_peer")


if __name__ == "__main__":
    unittest.main()
