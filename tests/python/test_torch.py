"""longhaul.torch: bucketing, and DiLoCo outer steps through three local daemons."""

import time
import unittest

import torch

from harness import GroupTestCase, LocalSites, in_parallel, join_all, raise_any
import longhaul
import longhaul.torch as lht

SITES = ["site-a", "site-b", "site-c"]


def bits(t):
    """The tensor's bytes, for bit-for-bit comparison (NaN and -0.0 included)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def make_model(hidden=32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, 3))


def drift(model, seed):
    """Stands in for a site's inner steps: a seeded change of every parameter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))


class BucketTest(unittest.TestCase):
    def test_plan_caps_buckets_and_keeps_order(self):
        sizes = [10, 300, 5, 1000, 1, 2, 3]
        tensors = [torch.zeros(n) for n in sizes]
        plan = lht.plan_buckets(tensors, bucket_bytes=1220)
        self.assertEqual(plan, [[0], [1, 2], [3], [4, 5, 6]])
        self.assertEqual(sum(plan, []), list(range(len(sizes))))
        for b in plan:
            size = sum(sizes[i] for i in b) * 4
            self.assertTrue(size <= 1220 or len(b) == 1, (b, size))
        self.assertEqual(lht.plan_buckets(tensors), [list(range(len(sizes)))], "64 MiB default")
        # The cap counts the wire dtype: half as many bytes per element in bfloat16.
        self.assertEqual(lht.plan_buckets(tensors, 1220, torch.bfloat16),
                         [[0, 1, 2], [3], [4, 5, 6]])
        with self.assertRaises(ValueError):
            lht.plan_buckets(tensors, 0)

    def test_flatten_unflatten_round_trip_is_exact(self):
        g = torch.Generator().manual_seed(3)
        tensors = [torch.randn(shape, generator=g) for shape in [(7, 5), (3,), (), (4, 1, 6)]]
        tensors[0][0, :5] = torch.tensor([float("nan"), -0.0, float("inf"), 1e-45, -3.4e38])
        tensors.append(torch.randn(33, generator=g).to(torch.bfloat16))  # exact in float32
        buckets = lht.Buckets(tensors, bucket_bytes=64)
        self.assertEqual(len(buckets.flats), len(buckets.plan))
        self.assertGreater(len(buckets.flats), 2)
        self.assertEqual(sum(buckets.bucket_bytes()), sum(t.numel() for t in tensors) * 4)
        buckets.flatten(tensors)
        out = [torch.zeros_like(t) for t in tensors]
        buckets.unflatten(out)
        for t, o in zip(tensors, out):
            self.assertEqual(o.dtype, t.dtype)
            self.assertEqual(bits(o), bits(t))
        with self.assertRaises(ValueError):
            buckets.flatten(tensors[:-1])
        with self.assertRaises(ValueError):
            buckets.flatten([torch.zeros(2)] + tensors[1:])


class OuterStepTest(GroupTestCase):
    SITES = SITES

    def sites_with(self, bucket_bytes=512, optimizer=True):
        models = [make_model() for _ in SITES]
        opts = [torch.optim.SGD(m.parameters(), lr=0.7, momentum=0.9, nesterov=True)
                if optimizer else None for m in models]
        steps = [lht.OuterStep(g, m, o, bucket_bytes=bucket_bytes, timeout=60)
                 for g, m, o in zip(self.groups, models, opts)]
        return models, steps

    def test_outer_steps_end_bit_identical_at_three_sites(self):
        models, steps = self.sites_with()
        self.assertGreater(len(steps[0].buckets.flats), 2, "several all-reduces per step")
        for rnd in range(3):
            for i, m in enumerate(models):
                drift(m, 10 * rnd + i)
            raise_any(in_parallel([s.step for s in steps]))
            for m in models[1:]:
                for p, q in zip(models[0].parameters(), m.parameters()):
                    self.assertEqual(bits(p), bits(q))
        self.assertEqual([s.round for s in steps], [3, 3, 3])
        for s, m in zip(steps, models):
            for g, p in zip(s.global_parameters(), m.parameters()):
                self.assertEqual(bits(g), bits(p))

    def test_without_optimizer_the_step_averages_parameters(self):
        models, steps = self.sites_with(optimizer=False)
        for i, m in enumerate(models):
            drift(m, i)
        want = [torch.stack(ps).mean(0) for ps in zip(*(m.parameters() for m in models))]
        raise_any(in_parallel([s.step for s in steps]))
        for p, w in zip(models[0].parameters(), want):
            torch.testing.assert_close(p.detach(), w, rtol=0, atol=1e-6)

    def test_average_pseudo_gradients_helper(self):
        before = [make_model() for _ in SITES]
        after = [make_model() for _ in SITES]
        for i, m in enumerate(after):
            drift(m, i)
        res = raise_any(in_parallel([
            lambda g=g, b=b, a=a: lht.average_pseudo_gradients(
                g, list(b.parameters()), list(a.parameters()), bucket_bytes=256, tag="h")
            for g, b, a in zip(self.groups, before, after)]))
        want = [torch.stack([b - a for b, a in zip(bs, as_)]).mean(0)
                for bs, as_ in zip(zip(*(m.parameters() for m in before)),
                                   zip(*(m.parameters() for m in after)))]
        for r in res[1:]:
            self.assertEqual([bits(t) for t in r], [bits(t) for t in res[0]])
        for r, w in zip(res[0], want):
            torch.testing.assert_close(r, w.detach(), rtol=0, atol=1e-6)

    def test_async_step_overlaps_and_matches_sync(self):
        # The same inputs, once synchronously...
        models, steps = self.sites_with()
        for i, m in enumerate(models):
            drift(m, i)
        raise_any(in_parallel([s.step for s in steps]))
        want = [bits(g) for g in steps[0].global_parameters()]

        # ...and once with site-a's step in flight while it keeps training.
        models, steps = self.sites_with()
        for i, m in enumerate(models):
            drift(m, i)
        t0 = time.monotonic()
        handle = steps[0].step(async_op=True)
        self.assertLess(time.monotonic() - t0, 0.5, "step(async_op=True) returns at once")
        time.sleep(0.3)
        self.assertFalse(handle.done(), "the others have not started theirs")
        with self.assertRaises(RuntimeError):
            steps[0].step()
        with torch.no_grad():
            for p in models[0].parameters():
                p.add_(1.0)  # an inner step taken meanwhile
        others = in_parallel([lambda s=s: s.step(async_op=True).wait(30) for s in steps[1:]])
        raise_any(others)
        handle.wait(30)
        self.assertTrue(handle.done())
        self.assertEqual([bits(g) for g in steps[0].global_parameters()], want)
        self.assertEqual([bits(g) for g in steps[1].global_parameters()], want)
        self.assertEqual(steps[0].round, 1)
        for p, g in zip(models[0].parameters(), steps[0].global_parameters()):
            torch.testing.assert_close(p.detach(), g + 1.0, rtol=0, atol=1e-5)
        for p, g in zip(models[1].parameters(), steps[1].global_parameters()):
            self.assertEqual(bits(p), bits(g), "no drift at site-b")

    def test_state_dict_hands_a_site_the_round_and_optimizer(self):
        models, steps = self.sites_with()
        for i, m in enumerate(models):
            drift(m, i)
        raise_any(in_parallel([s.step for s in steps]))
        fresh = make_model()
        opt = torch.optim.SGD(fresh.parameters(), lr=0.7, momentum=0.9, nesterov=True)
        joiner = lht.OuterStep(self.groups[2], fresh, opt, bucket_bytes=512)
        raise_any(in_parallel([
            lambda: lht.send_object(self.groups[0], "site-c", "state", steps[0].state_dict()),
            lambda: joiner.load_state_dict(lht.recv_object(self.groups[2], "site-a", "state"))]))
        self.assertEqual(joiner.round, 1)
        for p, q in zip(fresh.parameters(), models[0].parameters()):
            self.assertEqual(bits(p), bits(q))
        # With site-c's OuterStep replaced by the joiner, the next step stays identical.
        steps[2] = joiner
        models[2] = fresh
        for i, m in enumerate(models):
            drift(m, 5 + i)
        raise_any(in_parallel([s.step for s in steps]))
        for p, q in zip(models[0].parameters(), fresh.parameters()):
            self.assertEqual(bits(p), bits(q))


class LostPeerTest(unittest.TestCase):
    def test_lost_peer_surfaces_and_the_step_can_be_retried(self):
        with LocalSites(SITES) as sites:
            groups = join_all(sites, "torch-lost", SITES)
            models = [torch.nn.Linear(1024, 1024) for _ in SITES]  # 4 MiB of float32
            for m in models:
                with torch.no_grad():
                    for p in m.parameters():
                        p.fill_(0.5)
            steps = [lht.OuterStep(g, m, bucket_bytes=1 << 20, timeout=60)
                     for g, m in zip(groups, models)]
            for i, m in enumerate(models):
                drift(m, i)
            before = [[bits(p) for p in m.parameters()] for m in models[:2]]
            handles = [s.step(async_op=True) for s in steps[:2]]  # site-c never calls
            time.sleep(0.5)
            t0 = time.monotonic()
            sites.kill("site-c")
            for h in handles:
                with self.assertRaises(longhaul.PeerLostError) as ctx:
                    h.wait(30)
                self.assertEqual(ctx.exception.peer, "site-c")
                self.assertTrue(ctx.exception.retryable)
            self.assertLess(time.monotonic() - t0, 10)
            # Nothing was applied: the caller may retry.
            for s, m, b in zip(steps, models, before):
                self.assertEqual(s.round, 0)
                self.assertEqual([bits(p) for p in m.parameters()], b)
            self.assertEqual(groups[0].members, ["site-a", "site-b"])
            # The retry runs on the two remaining sites.
            raise_any(in_parallel([s.step for s in steps[:2]]))
            for p, q in zip(models[0].parameters(), models[1].parameters()):
                self.assertEqual(bits(p), bits(q))
            self.assertEqual([s.round for s in steps[:2]], [1, 1])
            for g in groups[:2]:
                g.close()


if __name__ == "__main__":
    unittest.main()
