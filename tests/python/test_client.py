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


class ClientOperationsTest(unittest.TestCase):
    """Every operation of the CLI, from Python: list, pause, resume, verify,
    peers and limit, and a relative source taken from the working directory."""

    def write(self, path, size):
        with open(path, "wb") as f:
            f.write(os.urandom(size))
        return path

    def test_list_pause_resume_verify(self):
        with LocalSites() as sites, tempfile.TemporaryDirectory(dir=sites.source_dir()) as src:
            path = self.write(os.path.join(src, "blob.bin"), 8 << 20)
            c = longhaul.Client(sites.address("site-a"))
            # 8 Mbit/s = 1 MB/s: the transfer is still running when paused.
            c.limit("8Mbit", peer="site-b")
            st = c.submit([path], "site-b:/ckpt/ops/blob.bin", chunk_size=1 << 20)
            self.assertIn(st["id"], [t["id"] for t in c.list()])
            paused = c.pause(st["id"])
            self.assertEqual(paused["state"], "PAUSED", paused.get("error"))
            self.assertEqual(c.get(st["id"])["state"], "PAUSED")
            c.limit("off", peer="site-b")
            self.assertNotEqual(c.resume(st["id"])["state"], "PAUSED")
            final = c.wait(st["id"], timeout=120)
            self.assertEqual(final["state"], "COMPLETED", final.get("error"))
            self.assertNotIn(st["id"], [t["id"] for t in c.list()])
            self.assertIn(st["id"], [t["id"] for t in c.list(all=True)])
            verified = c.verify(st["id"])
            self.assertTrue(verified["ok"], verified)
            self.assertEqual(int(verified["files_checked"]), 1)

    def test_peers_and_limits(self):
        with LocalSites() as sites:
            c = longhaul.Client(sites.address("site-a"))
            self.assertEqual([p["site"] for p in c.peers()["peers"]], ["site-b"])
            self.assertEqual(c.limit(), [])
            self.assertEqual(c.limit("16Mbit", peer="site-b"),
                             [{"peer": "site-b", "bits_per_second": 16000000}])
            self.assertEqual(c.limit(500_000_000, priority="background"),
                             [{"peer": "site-b", "bits_per_second": 16000000},
                              {"class": "background", "bits_per_second": 500000000}])
            self.assertEqual(c.limit(0, peer="site-b"),
                             [{"class": "background", "bits_per_second": 500000000}])
            self.assertEqual(c.limit("off", priority="background"), [])
            for bad in (dict(rate="1Gbit"), dict(rate="1Gbit", peer="site-b", priority="exchange"),
                        dict(rate="fast", peer="site-b"), dict(peer="site-b")):
                with self.assertRaises(ValueError, msg=str(bad)):
                    c.limit(**bad)
            with self.assertRaises(longhaul.Error):
                c.limit("1Gbit", peer="no-such-site")

    def test_sync_options_and_a_pull(self):
        with LocalSites() as sites, tempfile.TemporaryDirectory(dir=sites.source_dir()) as src:
            self.write(os.path.join(src, "a.bin"), 1 << 16)
            self.write(os.path.join(src, "DONE"), 16)
            os.symlink("a.bin", os.path.join(src, "link"))
            os.link(os.path.join(src, "a.bin"), os.path.join(src, "hard.bin"))
            a = longhaul.Client(sites.address("site-a"))
            st = a.submit([src], "site-b:/ckpt/opts", sync=True, checksum=True,
                          commit_last=["DONE"], symlinks="keep", hard_links=True)
            final = a.wait(st["id"], timeout=60)
            self.assertEqual(final["state"], "COMPLETED", final.get("error"))
            dest = os.path.join(sites.export_dir("site-b"), "opts")
            self.assertEqual(os.readlink(os.path.join(dest, "link")), "a.bin")
            self.assertEqual(os.stat(os.path.join(dest, "a.bin")).st_ino,
                             os.stat(os.path.join(dest, "hard.bin")).st_ino)
            # The same sync again, by content: nothing to send.
            again = a.wait(a.submit([src], "site-b:/ckpt/opts", sync=True, checksum=True)["id"],
                           timeout=60)
            self.assertEqual(again["state"], "COMPLETED", again.get("error"))
            self.assertEqual(int(again.get("bytes_sent", 0)), 0, again)
            # site-a pulls it back from site-b's export.
            pulled = a.wait(a.submit(["site-b:/ckpt/opts/a.bin"], "site-a:/ckpt/back.bin")["id"],
                            timeout=60)
            self.assertEqual(pulled["state"], "COMPLETED", pulled.get("error"))
            with open(os.path.join(sites.export_dir("site-a"), "back.bin"), "rb") as f, \
                    open(os.path.join(src, "a.bin"), "rb") as g:
                self.assertEqual(f.read(), g.read())

    def test_a_relative_source_is_taken_from_the_working_directory(self):
        with LocalSites() as sites, tempfile.TemporaryDirectory(dir=sites.source_dir()) as src:
            path = self.write(os.path.join(src, "rel.bin"), 1 << 20)
            c = longhaul.Client(sites.address("site-a"))
            cwd = os.getcwd()
            os.chdir(src)
            try:
                st = c.submit(["rel.bin"], "site-b:/ckpt/rel/rel.bin")
            finally:
                os.chdir(cwd)
            final = c.wait(st["id"], timeout=60)
            self.assertEqual(final["state"], "COMPLETED", final.get("error"))
            with open(os.path.join(sites.export_dir("site-b"), "rel", "rel.bin"), "rb") as f, \
                    open(path, "rb") as g:
                self.assertEqual(f.read(), g.read())


if __name__ == "__main__":
    unittest.main()
