"""allgather and broadcast through three local daemons, from Python."""

import threading
import time
import unittest

import numpy as np
import torch

from harness import GroupTestCase, LocalSites, in_parallel, join_all, raise_any
import longhaul

SITES = ["site-a", "site-b", "site-c"]


class GatherTest(GroupTestCase):
    SITES = SITES

    def test_numpy_allgather_concatenates_in_member_order(self):
        rng = np.random.default_rng(0)
        # Given in reverse site order: the result is in sorted member order.
        inputs = [rng.integers(0, 1 << 30, (1000, 3)).astype(np.int64) for _ in SITES]
        order = [2, 1, 0]
        res = raise_any(in_parallel(
            [lambda i=i: self.groups[i].allgather(inputs[i]) for i in order]))
        want = np.concatenate(inputs)
        for r in res:
            self.assertEqual(r.shape, (3000, 3))
            self.assertEqual(r.dtype, np.int64)
            np.testing.assert_array_equal(r, want)

    def test_torch_allgather_and_scalars(self):
        g = torch.Generator().manual_seed(1)
        inputs = [torch.randn(1 << 18, generator=g).to(torch.bfloat16) for _ in SITES]
        res = raise_any(in_parallel(
            [lambda i=i: self.groups[i].allgather(inputs[i]) for i in range(3)]))
        want = torch.cat(inputs)
        for r in res:
            self.assertIsInstance(r, torch.Tensor)
            self.assertEqual(r.dtype, torch.bfloat16)
            self.assertTrue(torch.equal(r.view(torch.int16), want.view(torch.int16)))
        scalars = [np.float32(i + 0.5) for i in range(3)]
        res = raise_any(in_parallel(
            [lambda i=i: self.groups[i].allgather(np.asarray(scalars[i])) for i in range(3)]))
        for r in res:
            np.testing.assert_array_equal(r, np.array([0.5, 1.5, 2.5], np.float32))

    def test_broadcast_in_place_numpy_and_torch(self):
        rng = np.random.default_rng(2)
        bufs = [rng.standard_normal(1 << 20).astype(np.float32) for _ in SITES]
        root = bufs[1].copy()
        raise_any(in_parallel(
            [lambda i=i: self.groups[i].broadcast(bufs[i], "site-b") for i in range(3)]))
        for b in bufs:
            self.assertEqual(b.tobytes(), root.tobytes())
        tensors = [torch.full((64, 64), float(i)) for i in range(3)]
        ptr = tensors[0].data_ptr()
        works = [self.groups[i].broadcast(tensors[i], root="site-c", async_op=True)
                 for i in range(3)]
        for w in works:
            w.wait(60)
        self.assertEqual(works[2].stats()["bytes_sent"], 2 * 64 * 64 * 4)
        self.assertEqual(tensors[0].data_ptr(), ptr, "in place")
        for t in tensors:
            self.assertTrue(torch.equal(t, torch.full((64, 64), 2.0)))

    def test_mixed_collectives_share_one_order_and_sizes_must_match(self):
        a = [np.full(10, i, np.float32) for i in range(3)]
        raise_any(in_parallel([lambda i=i: self.groups[i].allreduce(a[i]) for i in range(3)]))
        res = raise_any(in_parallel([lambda i=i: self.groups[i].allgather(a[i]) for i in range(3)]))
        np.testing.assert_array_equal(res[0], np.full(30, 3, np.float32))
        # site-c passes a different size: every site fails, naming the other.
        bad = [np.zeros(10, np.float32), np.zeros(10, np.float32), np.zeros(11, np.float32)]
        res = in_parallel([lambda i=i: self.groups[i].allgather(bad[i]) for i in range(3)])
        for r in res:
            self.assertIsInstance(r, longhaul.Error)
            self.assertIn("bytes, this site", str(r))
        # The group goes on.
        res = raise_any(in_parallel([lambda i=i: self.groups[i].allgather(a[i]) for i in range(3)]))
        self.assertEqual(len(res[2]), 30)


class GatherPeerLostTest(unittest.TestCase):
    def test_killed_site_fails_allgather_and_broadcast_then_two_continue(self):
        with LocalSites(SITES) as sites:
            ga, gb, gc = join_all(sites, "gather-loss", SITES)
            a, b = np.ones(1 << 20, np.float32), np.ones(1 << 20, np.float32)
            # site-c's daemon dies while site-a and site-b wait for its part.
            t0 = time.monotonic()
            res = []

            def gather_both():
                res.extend(in_parallel([lambda: ga.allgather(a, timeout=60),
                                        lambda: gb.allgather(b, timeout=60)]))

            t = threading.Thread(target=gather_both)
            t.start()
            time.sleep(0.5)
            sites.kill("site-c")
            t.join(60)
            for r in res:
                self.assertIsInstance(r, longhaul.PeerLostError)
                self.assertEqual(r.peer, "site-c")
                self.assertTrue(r.retryable)
            self.assertLess(time.monotonic() - t0, 20, "well within the 60 s deadline")
            self.assertEqual(ga.members, ["site-a", "site-b"])

            # The next calls run with the two remaining sites.
            res = raise_any(in_parallel([lambda: ga.allgather(np.full(4, 1, np.int32)),
                                         lambda: gb.allgather(np.full(4, 2, np.int32))]))
            np.testing.assert_array_equal(res[0], np.array([1] * 4 + [2] * 4, np.int32))
            np.testing.assert_array_equal(res[0], res[1])
            x, y = np.arange(100, dtype=np.float64), np.zeros(100)
            raise_any(in_parallel([lambda: ga.broadcast(x, "site-a"),
                                   lambda: gb.broadcast(y, "site-a")]))
            np.testing.assert_array_equal(x, y)
            # A broadcast from the lost site is the retryable loss.
            with self.assertRaises(longhaul.PeerLostError):
                ga.broadcast(x, "site-c")
            for g in (ga, gb):
                g.close()


if __name__ == "__main__":
    unittest.main()
