"""all-reduce and send/recv through two local daemons, from Python."""

import time
import unittest

import numpy as np
import torch

from harness import GroupTestCase, in_parallel
import longhaul

SITES = ["site-a", "site-b"]


class ExchangeTest(GroupTestCase):
    SITES = SITES

    def allreduce_both(self, bufs, **kw):
        res = in_parallel([lambda g=g, b=b: g.allreduce(b, **kw) for g, b in zip(self.groups, bufs)])
        for r in res:
            if isinstance(r, BaseException):
                raise r

    def test_numpy_float32_and_float16_match_local_sum(self):
        rng = np.random.default_rng(0)
        for dtype in (np.float32, np.float16):
            # Multiples of 1/4 in [-16, 16]: exact in float16, and so are their sums.
            a = (rng.integers(-64, 64, 10000) / 4).astype(dtype)
            b = (rng.integers(-64, 64, 10000) / 4).astype(dtype)
            want = (a.astype(np.float64) + b.astype(np.float64)).astype(dtype)
            ra, rb = a.copy(), b.copy()
            self.allreduce_both([ra, rb])
            np.testing.assert_array_equal(ra, want)
            self.assertEqual(ra.tobytes(), rb.tobytes())

    def test_torch_bfloat16_sum_and_float32_avg(self):
        g = torch.Generator().manual_seed(1)
        a = (torch.randint(-64, 64, (5000,), generator=g) / 4).to(torch.bfloat16)
        b = (torch.randint(-64, 64, (5000,), generator=g) / 4).to(torch.bfloat16)
        want = (a.float() + b.float()).to(torch.bfloat16)
        ra, rb = a.clone(), b.clone()
        ptr = ra.data_ptr()
        self.allreduce_both([ra, rb])
        self.assertEqual(ra.data_ptr(), ptr, "reduced in place")
        self.assertTrue(torch.equal(ra, want))
        self.assertTrue(torch.equal(ra.view(torch.int16), rb.view(torch.int16)))

        fa = torch.randn(1 << 20, generator=g)
        fb = torch.randn(1 << 20, generator=g)
        want = (fa + fb) / 2
        ra, rb = fa.clone(), fb.clone()
        self.allreduce_both([ra, rb], op="avg")
        self.assertTrue(torch.equal(ra.view(torch.int32), rb.view(torch.int32)), "bit-identical")
        self.assertTrue(torch.equal(ra, want))

    def test_quantized_is_identical_and_close(self):
        g = torch.Generator().manual_seed(2)
        a, b = torch.rand(4096, generator=g), torch.rand(4096, generator=g)
        ra, rb = a.clone(), b.clone()
        self.allreduce_both([ra, rb], quantize=True)
        self.assertTrue(torch.equal(ra, rb))
        self.assertLess(float((ra - (a + b)).abs().max()), 2 * (1.0 / 255))

    def test_async_work_stats_and_wrong_dtype(self):
        a, b = np.ones(1 << 16, np.float32), np.full(1 << 16, 2, np.float32)
        wa = self.groups[0].allreduce(a, async_op=True)
        wb = self.groups[1].allreduce(b, async_op=True)
        wa.wait(30)
        wb.wait(30)
        self.assertTrue(wa.test())
        st = wa.stats()
        self.assertEqual(st["peers"], 1)
        self.assertEqual(st["bytes_sent"], a.nbytes)
        self.assertEqual(st["generation"], self.groups[0].generation)
        np.testing.assert_array_equal(a, np.full(1 << 16, 3, np.float32))
        with self.assertRaises(TypeError):
            self.groups[0].allreduce(np.ones(4, np.int32))

    def test_failed_allreduce_keeps_the_input_for_the_retry(self):
        """A failed all-reduce (here site-a's deadline, site-b then aborted)
        leaves both arrays holding their input, although the client streamed
        them to the daemon; retried with them as they are, it gives the sum."""
        rng = np.random.default_rng(5)
        a = rng.standard_normal(3 << 20).astype(np.float32)  # 12 MiB: three wire segments
        b = rng.standard_normal(3 << 20).astype(np.float32)
        ra, rb = a.copy(), b.copy()
        with self.assertRaises(longhaul.TimeoutError):
            self.groups[0].allreduce(ra, timeout=0.3)
        with self.assertRaises(longhaul.Error) as ctx:
            self.groups[1].allreduce(rb)
        self.assertIn("site-a gave up", str(ctx.exception))
        self.assertTrue(ctx.exception.retryable)
        np.testing.assert_array_equal(ra, a)
        np.testing.assert_array_equal(rb, b)
        self.allreduce_both([ra, rb])
        np.testing.assert_array_equal(ra, a + b)
        self.assertEqual(ra.tobytes(), rb.tobytes())

    def test_send_recv_by_tag(self):
        x = torch.arange(100000, dtype=torch.float64)
        self.groups[0].send("site-b", "weights", x)
        self.groups[0].send("site-b", "meta", np.frombuffer(b"step=7", np.uint8))
        out = np.zeros(16, np.uint8)
        n = self.groups[1].recv("site-a", "meta", out)
        self.assertEqual(out[:n].tobytes(), b"step=7")
        y = torch.zeros(100000, dtype=torch.float64)
        self.assertEqual(self.groups[1].recv("site-a", "weights", y), x.numel() * 8)
        self.assertTrue(torch.equal(x, y))

    def test_async_send_and_recv_both_ways_every_round_exact(self):
        """Both sites send and receive at once, as a DiLoCo step does; the
        buffers are streamed through shared memory and reused every round, and
        every round's bytes arrive exactly (none of the previous round's)."""
        rng = np.random.default_rng(3)
        n = (9 << 20) + 11
        outs = [np.empty(n, np.uint8), np.empty(n, np.uint8)]
        for rnd in range(3):
            ins = [rng.integers(0, 256, n, dtype=np.uint8) for _ in range(2)]
            for o in outs:
                o.fill(0xee)
            peers = ["site-b", "site-a"]

            def one(i, rnd=rnd, ins=ins):
                work = self.groups[i].send(peers[i], f"r{rnd}", ins[i], async_op=True)
                got = self.groups[i].recv(peers[i], f"r{rnd}", outs[i])
                work.wait(30)
                return got

            res = in_parallel([lambda: one(0), lambda: one(1)])
            for r in res:
                if isinstance(r, BaseException):
                    raise r
            self.assertEqual(res, [n, n])
            np.testing.assert_array_equal(outs[0], ins[1])
            np.testing.assert_array_equal(outs[1], ins[0])

    def test_timeout_then_cancel(self):
        x = np.ones(1024, np.float32)
        t0 = time.monotonic()
        with self.assertRaises(longhaul.TimeoutError) as ctx:
            self.groups[0].allreduce(x, timeout=0.3)
        self.assertIn("waiting for site-b", str(ctx.exception))
        self.assertIsInstance(ctx.exception, TimeoutError)
        self.assertLess(time.monotonic() - t0, 5)
        # site-b's matching call learns that site-a gave up.
        with self.assertRaises(longhaul.Error) as ctx:
            self.groups[1].allreduce(x)
        self.assertIn("site-a gave up", str(ctx.exception))

        w = self.groups[0].allreduce(x, async_op=True)
        with self.assertRaises(longhaul.TimeoutError):
            w.wait(0.1)  # still running: site-b has not called
        w.cancel()
        with self.assertRaises(longhaul.CancelledError):
            w.wait(10)

    def test_exchange_class_cap_is_charged_for_every_byte_sent(self):
        """`longhaul limit --class exchange` caps exchanges: their bytes are
        charged to the cap (the daemon's /metrics accounting), not to others."""
        import json
        import os
        import re
        import subprocess
        import urllib.request

        cli = os.path.join(os.environ["LONGHAUL_BIN"], "longhaul")

        def limit(*args):
            out = subprocess.run([cli, "--daemon", self.sites.address("site-a"), "limit", *args,
                                  "--json"], check=True, capture_output=True, text=True).stdout
            return json.loads(out)

        def capped(cls):
            log = open(os.path.join(self.sites.dir, "site-a", "longhauld.log")).read()
            port = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", log).group(1)
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            m = re.search(r'^longhaul_rate_capped_bytes_total\{scope="class",name="%s"\} (\S+)$' % cls,
                          text, re.M)
            return float(m.group(1)) if m else 0.0

        self.assertEqual(limit("--class", "exchange", "400Mbit"),
                         {"limits": [{"class": "exchange", "bits_per_second": 400000000}]})
        try:
            before = capped("exchange")
            data = np.arange(3 << 20, dtype=np.uint8)  # 3 MiB: one segment
            self.groups[0].send("site-b", "capped", data)
            out = np.zeros_like(data)
            self.assertEqual(self.groups[1].recv("site-a", "capped", out), data.nbytes)
            np.testing.assert_array_equal(out, data)
            self.assertEqual(capped("exchange") - before, data.nbytes)
            self.assertEqual(capped("checkpoint"), 0.0)
        finally:
            self.assertEqual(limit("--class", "exchange", "off"), {"limits": []})
        # With the cap lifted, nothing more is charged to it.
        self.groups[0].send("site-b", "free", data)
        self.groups[1].recv("site-a", "free", out)
        self.assertEqual(capped("exchange") - before, data.nbytes)


if __name__ == "__main__":
    unittest.main()
