"""Client.submit / wait / watch with progress callbacks, from Python."""

import os
import tempfile
import unittest

from harness import LocalSites
import longhaul


class ClientTest(unittest.TestCase):
    def test_submit_wait_with_progress_then_watch(self):
        with LocalSites() as sites, tempfile.TemporaryDirectory(dir=sites.source_dir()) as src:
            path = os.path.join(src, "blob.bin")
            with open(path, "wb") as f:
                f.write(os.urandom(3 << 20))
            c = longhaul.Client(sites.address("site-a"))
            st = c.submit([path], "site-b:/ckpt/py/blob.bin", chunk_size=1 << 20)
            self.assertIn(st["state"], ("QUEUED", "RUNNING", "PUBLISHING", "COMPLETED"))
            seen = []
            final = c.wait(st["id"], timeout=60, progress=seen.append)
            self.assertEqual(final["state"], "COMPLETED", final.get("error"))
            self.assertTrue(seen and seen[-1]["state"] == "COMPLETED")
            with open(os.path.join(sites.export_dir("site-b"), "py", "blob.bin"), "rb") as f, \
                    open(path, "rb") as g:
                self.assertEqual(f.read(), g.read())
            watched = []
            self.assertEqual(c.watch(st["id"], watched.append)["state"], "COMPLETED")
            self.assertTrue(watched)
            with self.assertRaises(longhaul.Error) as ctx:
                c.get("no-such-transfer")
            self.assertTrue(str(ctx.exception))

    def test_submit_with_also_fans_out_to_every_destination(self):
        sites_ = ("site-a", "site-b", "site-c")
        with LocalSites(sites_) as sites, tempfile.TemporaryDirectory(dir=sites.source_dir()) as src:
            path = os.path.join(src, "blob.bin")
            with open(path, "wb") as f:
                f.write(os.urandom(3 << 20))
            c = longhaul.Client(sites.address("site-a"))
            st = c.submit([path], "site-b:/ckpt/fan/blob.bin", chunk_size=1 << 20,
                          also=["site-c:/ckpt/fan/blob.bin"])
            final = c.wait(st["id"], timeout=60)
            self.assertEqual(final["state"], "COMPLETED", final.get("error"))
            self.assertEqual([d["destination"]["site"] for d in final["destinations"]],
                             ["site-b", "site-c"])
            self.assertEqual(final["destinations"][1]["relay_by"], "site-b")
            for site in ("site-b", "site-c"):
                with open(os.path.join(sites.export_dir(site), "fan", "blob.bin"), "rb") as f, \
                        open(path, "rb") as g:
                    self.assertEqual(f.read(), g.read(), site)

    def test_callback_exception_is_raised(self):
        with LocalSites() as sites, tempfile.TemporaryDirectory(dir=sites.source_dir()) as src:
            path = os.path.join(src, "x")
            with open(path, "wb") as f:
                f.write(b"x" * 1000)
            c = longhaul.Client(sites.address("site-a"))
            st = c.submit([path], "site-b:/ckpt/py2/x")

            def boom(_):
                raise ValueError("from the callback")

            with self.assertRaisesRegex(ValueError, "from the callback"):
                c.wait(st["id"], timeout=60, progress=boom)


if __name__ == "__main__":
    unittest.main()
