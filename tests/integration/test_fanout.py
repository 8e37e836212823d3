"""Fan-out: `longhaul cp SRC site-b:/ckpt/x --also site-c:/ckpt/x` delivers
one transfer to several sites. The source sends the bytes once, to site-b,
which relays every chunk to site-c as soon as it is durable. Each destination
publishes on its own; a relay that dies is bypassed and both still complete
bit-identical; a destination refuses a relay that is not one of its writers,
and the source then sends to it directly."""

import json
import os
import shutil
import time
import unittest

import lh

MIB = 1 << 20


class FanoutTestCase(lh.AccessTestCase):
    site_names = ("site-a", "site-b", "site-c")

    def source_tree(self, name="step-100", files=3, size=4 * MIB):
        src = os.path.join(self.sites.export("site-a"), name)
        for i in range(files):
            lh.write_random(os.path.join(src, f"shard_{i}.bin"), size, seed=i + 11)
        with open(os.path.join(src, ".metadata"), "w") as f:
            f.write("commit marker")
        return src

    def dest(self, site, name="step-100"):
        return os.path.join(self.sites.export(site), name)

    def fanout(self, src, *extra, verb="cp", name="step-100", wait=True):
        args = [verb, src, f"site-b:/ckpt/{name}", "--also", f"site-c:/ckpt/{name}", "--json",
                *extra] + (["--wait"] if wait else [])
        proc = self.sites.cli("a", *args)
        out = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
        return proc, out


class FanoutTest(FanoutTestCase):
    def test_source_sends_once_and_both_destinations_publish_identical(self):
        src = self.source_tree()
        data = 3 * 4 * MIB + len("commit marker")
        proc, out = self.fanout(src, "--chunk-size", "1MiB")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(out["state"], "COMPLETED", out)
        for site in ("site-b", "site-c"):
            self.assertEqual(lh.tree_digest(src), lh.tree_digest(self.dest(site)), site)
        # The bytes left the source once: site-c got them from site-b.
        self.assertLessEqual(out["bytes_sent"], 1.1 * data, out)
        dests = out["destinations"]
        self.assertEqual([d["destination"] for d in dests],
                         ["site-b:/ckpt/step-100", "site-c:/ckpt/step-100"])
        self.assertEqual([d["state"] for d in dests], ["COMPLETED", "COMPLETED"])
        self.assertEqual(dests[0]["relay_by"], "")
        self.assertEqual(dests[1]["relay_by"], "site-b")
        self.assertEqual(dests[1]["bytes_sent"], 0, dests)
        self.assertEqual(dests[1]["bytes_done"], dests[1]["bytes"], dests)
        # site-a opened site-c's transfer itself; site-b sent it the chunks.
        self.assertEqual(dests[1]["id"], out["id"] + ".1")
        self.assertIn(f"transfer {dests[1]['id']} from site-a: opened", self.sites.log("site-c"))
        self.assertIn(f"transfer {out['id']}: relaying its chunks to site-c",
                      self.sites.log("site-b"))
        # verify checks both destinations against the source.
        verified = json.loads(self.sites.cli("a", "verify", out["id"], "--json", check=True).stdout)
        self.assertTrue(verified["ok"], verified)
        self.assertEqual(verified["files_checked"], 2 * 4)
        # The text status names every destination and who relays it.
        text = self.sites.cli("a", "status", out["id"], check=True).stdout
        self.assertIn("site-c:/ckpt/step-100  (relayed by site-b)", text)
        listed = self.sites.cli("a", "ls", "--all", check=True).stdout
        self.assertIn(f"site-b:/ckpt/step-100  (+1 more: status {out['id']})", listed)

    def test_a_tree_with_hard_links_arrives_linked_at_both_destinations(self):
        src = self.source_tree()
        os.link(os.path.join(src, "shard_0.bin"), os.path.join(src, "shard_0.link"))
        proc, out = self.fanout(src, "--hard-links", "--chunk-size", "1MiB")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(out["state"], "COMPLETED", out)
        for site in ("site-b", "site-c"):
            self.assertEqual(lh.tree_digest(src), lh.tree_digest(self.dest(site)), site)
            self.assertEqual(os.stat(os.path.join(self.dest(site), "shard_0.bin")).st_ino,
                             os.stat(os.path.join(self.dest(site), "shard_0.link")).st_ino, site)
        self.assertEqual(out["destinations"][1]["relay_by"], "site-b", out)
        self.assertEqual(out["destinations"][1]["bytes_sent"], 0, out)

    def test_sync_keep_with_also_replicates_and_prunes_at_both_destinations(self):
        run = os.path.join(self.sites.export("site-a"), "run")
        for step in (100, 200, 300):
            self.source_tree(os.path.join("run", f"step-{step}"), files=2, size=MIB)

        def sync():
            proc = self.sites.cli("a", "sync", run, "site-b:/ckpt/run", "--also", "site-c:/ckpt/run",
                                  "--keep", "2", "--wait", "--json")
            self.assertEqual(proc.returncode, 0, proc.stderr + proc.stdout)

        def assert_both_hold_only(*steps):
            for site in ("site-b", "site-c"):
                self.assertEqual(sorted(os.listdir(self.dest(site, "run"))), list(steps), site)
                for step in steps:
                    self.assertEqual(lh.tree_digest(os.path.join(run, step)),
                                     lh.tree_digest(os.path.join(self.dest(site, "run"), step)))

        sync()
        assert_both_hold_only("step-200", "step-300")
        # site-c lost step-300, which site-b holds unchanged and so does not
        # relay: the source sends it to site-c itself.
        shutil.rmtree(os.path.join(self.dest("site-c", "run"), "step-300"))
        self.source_tree(os.path.join("run", "step-400"), files=2, size=MIB)
        sync()
        assert_both_hold_only("step-300", "step-400")
        self.assertIn("unchanged and does not send it on",
                      self.sites.log("site-a"))

    def test_bad_fanouts_are_refused_with_what_to_fix(self):
        src = self.source_tree()
        proc = self.sites.cli("a", "cp", src, "site-b:/ckpt/x", "--also", "site-b:/ckpt/y")
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("site site-b is named twice", proc.stderr)
        proc = self.sites.cli("a", "cp", src, "site-b:/ckpt/x", "--also", "site-z:/ckpt/y")
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("unknown peer site 'site-z' in --also", proc.stderr)
        proc = self.sites.cli("a", "cp", src, "site-b:/ckpt/x", "--also", "site-c:/ckpt")
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("needs a path below the export", proc.stderr)
        proc = self.sites.cli("b", "cp", "site-a:/ckpt/step-100", "site-b:/ckpt/x", "--also",
                              "site-c:/ckpt/x")
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("--also needs local sources", proc.stderr)
        for site in ("site-b", "site-c"):
            self.assertFalse(os.path.exists(self.dest(site, "x")))
            self.assertFalse(os.path.exists(self.dest(site, "y")))


class RelayNotAWriterTest(FanoutTestCase):
    # site-c lets only site-a write: site-b may not relay into it.
    writers = "site-c=site-a"

    def test_destination_refuses_a_relay_that_is_not_a_writer_and_the_source_sends_directly(self):
        src = self.source_tree()
        data = 3 * 4 * MIB + len("commit marker")
        proc, out = self.fanout(src)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(out["state"], "COMPLETED", out)
        for site in ("site-b", "site-c"):
            self.assertEqual(lh.tree_digest(src), lh.tree_digest(self.dest(site)), site)
        # site-c took nothing from site-b: the source sent it everything itself.
        self.assertIn("relay refused: site-b may not write into export ckpt of site-c",
                      self.sites.log("site-a"))
        dests = out["destinations"]
        self.assertEqual(dests[1]["relay_by"], "", dests)
        self.assertGreaterEqual(dests[1]["bytes_sent"], data, dests)
        self.assertGreaterEqual(out["bytes_sent"], 2 * data, out)


class OriginNotAWriterTest(FanoutTestCase):
    # site-c lets only site-b write: the source itself may not.
    writers = "site-c=site-b"

    def test_destination_refuses_a_source_that_is_not_a_writer(self):
        src = self.source_tree()
        proc, out = self.fanout(src)
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertEqual(out["state"], "FAILED", out)
        self.assertIn("site-a may not write into export ckpt of site-c", out["error"])
        self.assertFalse(os.path.exists(self.dest("site-c")))


class FanoutCrashTest(FanoutTestCase):
    def start_big_fanout(self):
        src = os.path.join(self.sites.export("site-a"), "big")
        for i in range(3):
            lh.write_random(os.path.join(src, f"shard_{i}.bin"), 96 * MIB, seed=i)
        proc, out = self.fanout(src, "--chunk-size", "8MiB", "--streams", "2", name="big",
                                wait=False)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return src, out["id"]

    def wait_relayed(self, tid, fraction):
        """Until site-c holds `fraction` of the data, relayed by site-b."""
        deadline = time.time() + 120
        while True:
            s = self.sites.status("a", tid)
            relayed = s["destinations"][1]
            if relayed["bytes"] and relayed["bytes_done"] >= fraction * relayed["bytes"]:
                self.assertEqual(relayed["relay_by"], "site-b", s)
                return
            self.assertNotEqual(s["state"], "COMPLETED", "finished before the kill; make it larger")
            self.assertLess(time.time(), deadline, f"site-c made no progress: {s}")
            time.sleep(0.02)

    def finish(self, src, tid):
        done = self.sites.wait_state("a", tid, {"COMPLETED", "FAILED"}, timeout=300)
        self.assertEqual(done["state"], "COMPLETED", done.get("error"))
        for site in ("site-b", "site-c"):
            self.assertEqual(lh.tree_digest(src), lh.tree_digest(self.dest(site, "big")), site)
        verified = json.loads(self.sites.cli("a", "verify", tid, "--json", check=True).stdout)
        self.assertTrue(verified["ok"], verified)
        return done["destinations"]

    def test_relay_sigkilled_mid_transfer_is_bypassed_and_both_complete_identical(self):
        src, tid = self.start_big_fanout()
        self.wait_relayed(tid, 0.2)
        self.sites.kill("site-b")
        # The source sends to site-c directly while site-b is down.
        deadline = time.time() + 60
        while self.sites.status("a", tid)["destinations"][1]["relay_by"]:
            self.assertLess(time.time(), deadline, "site-b was not bypassed")
            time.sleep(0.1)
        self.sites.up()  # restarts site-b, which resumes its own copy
        dests = self.finish(src, tid)
        self.assertEqual(dests[1]["relay_by"], "", dests)
        # site-c kept what the relay delivered: the source sent it only the rest.
        self.assertLess(dests[1]["bytes_sent"], 0.85 * dests[1]["bytes"], dests)

    def test_a_source_file_rewritten_mid_transfer_arrives_new_at_both(self):
        src, tid = self.start_big_fanout()
        self.wait_relayed(tid, 0.2)
        lh.rewrite_in_place(os.path.join(src, "shard_0.bin"), 96 * MIB, seed=99)
        self.finish(src, tid)

    def test_fanout_resumes_after_the_source_is_sigkilled(self):
        src, tid = self.start_big_fanout()
        self.wait_relayed(tid, 0.2)
        self.sites.kill("site-a")
        self.sites.up()  # restarts site-a, which resumes every destination from its journal
        dests = self.finish(src, tid)
        self.assertEqual([d["state"] for d in dests], ["COMPLETED", "COMPLETED"])
        # Both destinations kept what they held: nothing was sent twice over.
        done = self.sites.status("a", tid)
        self.assertLess(done["bytes_sent"], 1.5 * dests[0]["bytes"], done)


if __name__ == "__main__":
    unittest.main()
