"""A site killed in the middle of an all-reduce: three local daemons."""

import time
import unittest

import numpy as np

from harness import LocalSites, in_parallel, join_all
import longhaul

SITES = ["site-a", "site-b", "site-c"]


class PeerLostTest(unittest.TestCase):
    def test_killed_peer_is_retryable_and_next_generation_works(self):
        with LocalSites(SITES) as sites:
            groups = join_all(sites, "three", SITES)
            ga, gb, gc = groups
            gen = ga.generation
            self.assertEqual(gen, gb.generation)
            self.assertEqual(ga.members, SITES)
            # One round with all three works.
            bufs = [np.full(1 << 20, i + 1, np.float32) for i in range(3)]
            res = in_parallel([lambda g=g, b=b: g.allreduce(b) for g, b in zip(groups, bufs)])
            self.assertEqual(res, [None, None, None])
            np.testing.assert_array_equal(bufs[0], np.full(1 << 20, 6, np.float32))

            # site-a and site-b start the next one; site-c's daemon dies meanwhile.
            a, b = np.ones(1 << 22, np.float32), np.ones(1 << 22, np.float32)
            wa = ga.allreduce(a, timeout=60, async_op=True)
            wb = gb.allreduce(b, timeout=60, async_op=True)
            time.sleep(0.5)
            t0 = time.monotonic()
            sites.kill("site-c")
            for w in (wa, wb):
                with self.assertRaises(longhaul.PeerLostError) as ctx:
                    w.wait(30)
                self.assertEqual(ctx.exception.peer, "site-c")
                self.assertTrue(ctx.exception.retryable)
                self.assertIn("peer site-c was lost", str(ctx.exception))
            self.assertLess(time.monotonic() - t0, 10, "well within the 60 s deadline")
            self.assertEqual(ga.generation, gen + 1)
            self.assertEqual(ga.members, ["site-a", "site-b"])

            # The next call runs with the two remaining sites.
            a, b = np.full(1000, 1.5, np.float32), np.full(1000, 2.0, np.float32)
            res = in_parallel([lambda: ga.allreduce(a), lambda: gb.allreduce(b)])
            self.assertEqual(res, [None, None])
            np.testing.assert_array_equal(a, np.full(1000, 3.5, np.float32))
            np.testing.assert_array_equal(a, b)
            for g in (ga, gb):
                g.close()


if __name__ == "__main__":
    unittest.main()
