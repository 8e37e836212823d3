"""Pull and third-party copy: `longhaul cp SITE:/EXPORT/PATH SITE:/EXPORT/PATH`
issued at the destination (pull) or at a third site. The source site sends
only what its export's `readers` allow, only from inside that export, and
the destination's `writers` still decide for a third-party copy. A pull
resumes after either side is SIGKILLed and publishes bit-identical."""

import json
import os
import sys
import time
import unittest

import lh

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "security"))
import hostile_peer  # noqa: E402

MIB = 1 << 20
CHUNK = 8 * MIB
STREAMS = 4


class PullTestCase(lh.AccessTestCase):
    def source_tree(self, name="step-100", files=3, size=256 << 10):
        src = os.path.join(self.sites.export("site-a"), name)
        for i in range(files):
            lh.write_random(os.path.join(src, f"shard_{i}.bin"), size, seed=i + 7)
        with open(os.path.join(src, ".metadata"), "w") as f:
            f.write("commit marker")
        return src

    def dest(self, name="step-100"):
        return os.path.join(self.sites.export("site-b"), name)

    def copy(self, at, src, dst, *extra, wait=True):
        args = ["cp", src, dst, "--json", *extra] + (["--wait"] if wait else [])
        proc = self.sites.cli(at, *args)
        out = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
        return proc, out

    def listed(self, site, tid):
        proc = self.sites.cli(site, "ls", "--all", "--json", check=True)
        return [t for t in json.loads(proc.stdout)["transfers"] if t["id"] == tid]

    def hostile(self, as_site):
        """A REMOTE channel to site-a, as `as_site` with its valid certificate."""
        with open(self.sites.path("site-a", "longhauld.yaml")) as f:
            listen = [line for line in f if line.startswith("listen:")][0].split()[1]
        peer = hostile_peer.HostilePeer(self.sites.path("pki"), as_site, listen, "site-a")
        return peer.remote()


class PullTest(PullTestCase):
    # site-b lets nobody write: a pull needs no writers entry at the destination.
    writers = "site-b="
    readers = "site-a=site-b"

    def test_pull_issued_at_the_destination_publishes_and_shows_at_both_sites(self):
        src = self.source_tree()
        proc, out = self.copy("b", "site-a:/ckpt/step-100", "site-b:/ckpt/step-100")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(out["state"], "COMPLETED", out)
        self.assertEqual(out["source"], "site-a:/ckpt/step-100")
        self.assertEqual(lh.tree_digest(src), lh.tree_digest(self.dest()))
        tid = out["id"]
        # One transfer, one id: the issuing site's record and the source's.
        at_b = self.listed("b", tid)
        at_a = self.listed("a", tid)
        self.assertEqual([t["state"] for t in at_b], ["COMPLETED"])
        self.assertEqual([t["state"] for t in at_a], ["COMPLETED"])
        self.assertEqual(at_a[0]["requested_by"], "site-b")
        self.assertEqual(self.sites.status("b", tid)["state"], "COMPLETED")
        self.assertEqual(self.sites.status("a", tid)["destination"], "site-b:/ckpt/step-100")
        # site-a sent the bytes, not site-b: only site-a's metrics count them.
        self.assertGreater(self.sites.metric("site-a", "longhaul_bytes_sent_total"), 0)
        self.assertEqual(self.sites.metric("site-b", "longhaul_bytes_sent_total"), 0)

    def test_retried_pull_with_the_same_request_id_starts_one_transfer(self):
        self.source_tree()
        _, first = self.copy("b", "site-a:/ckpt/step-100", "site-b:/ckpt/step-100",
                             "--request-id", "pull-1")
        _, again = self.copy("b", "site-a:/ckpt/step-100", "site-b:/ckpt/step-100",
                             "--request-id", "pull-1")
        self.assertEqual(first["id"], again["id"])
        proc = self.sites.cli("a", "ls", "--all", "--json", check=True)
        self.assertEqual(len(json.loads(proc.stdout)["transfers"]), 1)

    def test_sync_pull_twice_sends_nothing_the_second_time(self):
        src = self.source_tree()
        for run in range(2):
            proc = self.sites.cli("b", "sync", "site-a:/ckpt/step-100", "site-b:/ckpt/step-100",
                                  "--wait", "--json")
            self.assertEqual(proc.returncode, 0, proc.stderr)
            out = json.loads(proc.stdout)
            self.assertEqual(out["state"], "COMPLETED", out)
        self.assertEqual(out["files_unchanged"], 4)
        self.assertEqual(out["bytes_sent"], 0)
        self.assertEqual(lh.tree_digest(src), lh.tree_digest(self.dest()))

    def test_the_pulls_source_may_write_only_the_path_pulled(self):
        # The pull lets site-a write step-100 only: a push of its own to
        # another path of site-b, which lists no writers, is refused.
        self.source_tree()
        other = os.path.join(self.sites.export("site-a"), "other")
        lh.write_random(os.path.join(other, "f.bin"), 1000, seed=1)
        proc, out = self.copy("b", "site-a:/ckpt/step-100", "site-b:/ckpt/step-100", wait=False)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        push, result = self.copy("a", other, "site-b:/ckpt/step-100-not")
        self.assertNotEqual(push.returncode, 0)
        self.assertIn("not one of the export's writers", push.stderr + push.stdout)
        self.assertFalse(os.path.exists(self.dest("step-100-not")))

    def test_pull_of_a_path_outside_the_export_or_through_dotdot_is_refused(self):
        for path in ("site-a:/ckpt/../etc", "site-a:/ckpt/.longhaul/staging"):
            proc, _ = self.copy("b", path, "site-b:/ckpt/x")
            self.assertEqual(proc.returncode, 2, f"{path}: {proc.stderr}")
        self.assertFalse(os.path.exists(self.dest("x")))

    def test_cancel_at_the_destination_cancels_at_the_source(self):
        src = os.path.join(self.sites.export("site-a"), "big")
        lh.write_random(os.path.join(src, "shard.bin"), 256 * MIB, seed=3)
        self.sites.cli("a", "limit", "--peer", "site-b", "50Mbit", check=True)
        proc, out = self.copy("b", "site-a:/ckpt/big", "site-b:/ckpt/big", wait=False)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        tid = out["id"]
        self.sites.cli("b", "cancel", tid, check=True)
        self.assertEqual(self.sites.wait_state("a", tid, {"CANCELLED", "COMPLETED"})["state"],
                         "CANCELLED")
        self.assertEqual(self.sites.wait_state("b", tid, {"CANCELLED", "COMPLETED"})["state"],
                         "CANCELLED")
        self.assertFalse(os.path.exists(self.dest("big")))


class NotAReaderTest(PullTestCase):
    # site-b may write into site-a... but is not one of site-a's readers.
    readers = "site-a="

    def test_a_site_not_in_readers_is_refused_with_what_to_fix(self):
        self.source_tree()
        proc, _ = self.copy("b", "site-a:/ckpt/step-100", "site-b:/ckpt/step-100")
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("site-a's export 'ckpt' does not exist or does not list site-b in readers; "
                      "add it to exports[].readers at site-a", proc.stderr)
        self.assertFalse(os.path.exists(self.dest()))
        self.assertEqual(json.loads(self.sites.cli("a", "ls", "--all", "--json",
                                                   check=True).stdout)["transfers"], [])


class ThirdPartyTest(PullTestCase):
    site_names = ("site-a", "site-b", "site-c")
    # site-c may read from site-a; only site-a may write into site-b.
    readers = "site-a=site-c"
    writers = "site-b=site-a"

    def test_third_party_copy_goes_from_a_to_b(self):
        src = self.source_tree()
        proc, out = self.copy("c", "site-a:/ckpt/step-100", "site-b:/ckpt/step-100")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(out["state"], "COMPLETED", out)
        self.assertEqual(lh.tree_digest(src), lh.tree_digest(self.dest()))
        # site-a sent it to site-b itself; nothing passed through site-c's export.
        at_a = self.listed("a", out["id"])
        self.assertEqual(at_a[0]["requested_by"], "site-c")
        self.assertEqual(at_a[0]["destination"], "site-b:/ckpt/step-100")
        self.assertFalse(os.path.exists(os.path.join(self.sites.export("site-c"), "step-100")))

    def test_a_third_party_that_is_not_a_reader_is_refused(self):
        self.source_tree()
        # site-b is not among site-a's readers (only site-c is).
        proc, _ = self.copy("b", "site-a:/ckpt/step-100", "site-c:/ckpt/step-100")
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("does not list site-b in readers", proc.stderr)


class ThirdPartyWithoutWritersTest(PullTestCase):
    site_names = ("site-a", "site-b", "site-c")
    readers = "site-a=site-c"
    writers = "site-b=site-c"  # site-a may not write into site-b

    def test_destination_that_does_not_list_the_source_in_writers_refuses(self):
        self.source_tree()
        # Refused before submit: the source asks the destination first.
        proc, out = self.copy("c", "site-a:/ckpt/step-100", "site-b:/ckpt/step-100")
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIsNone(out)
        self.assertIn("site-a may not write into export ckpt of site-b", proc.stderr)
        self.assertFalse(os.path.exists(self.dest()))


class HostilePeerTest(PullTestCase):
    """A peer with a valid certificate crafts REMOTE requests itself."""
    site_names = ("site-a", "site-b", "site-c")
    readers = "site-a=site-b"

    def submit(self, as_site, source_path, **spec):
        channel = self.hostile(as_site)
        try:
            return channel.remote_submit(
                f"req-{source_path}-{as_site}",
                hostile_peer.transfer_spec("ckpt", source_path, spec.pop("dest_site", as_site),
                                           "ckpt", "got", **spec))
        finally:
            channel.close()

    def assert_nothing_sent(self):
        self.assertEqual(json.loads(self.sites.cli("a", "ls", "--all", "--json",
                                                   check=True).stdout)["transfers"], [])

    def test_paths_outside_the_export_are_refused(self):
        self.source_tree()
        outside = self.sites.path("outside")
        lh.write_random(os.path.join(outside, "secret.bin"), 1000, seed=2)
        os.symlink(outside, os.path.join(self.sites.export("site-a"), "escape"))
        for path in ("../outside", "step-100/../../outside", "/etc/passwd", "escape",
                     ".longhaul", "", "step-100//shard_0.bin"):
            answer = self.submit("site-b", path)
            self.assertFalse(answer.ok(), f"{path!r} was accepted")
        self.assert_nothing_sent()

    def test_refusals_name_the_export_never_a_host_path(self):
        # Where the export lies on the source's host, and where a symlink in
        # it points, are not the requester's business.
        self.source_tree()
        outside = self.sites.path("outside")
        lh.write_random(os.path.join(outside, "secret.bin"), 1000, seed=2)
        export = self.sites.export("site-a")
        os.symlink(outside, os.path.join(export, "escape"))
        for path in ("escape", "escape/secret.bin"):
            answer = self.submit("site-b", path)
            self.assertFalse(answer.ok(), f"{path!r} was accepted")
            for host_path in (export, os.path.realpath(export), outside):
                self.assertNotIn(host_path, answer.error)
        self.assert_nothing_sent()

    def test_a_peer_naming_another_site_as_requester_is_refused(self):
        self.source_tree()
        # site-c is not a reader; it claims to be site-b, which is.
        answer = self.submit("site-c", "step-100", dest_site="site-c", requested_by="site-b")
        self.assertFalse(answer.ok())
        self.assertIn("came from site-c", answer.error)
        # Without the claim it is refused as what it is: not a reader.
        answer = self.submit("site-c", "step-100", dest_site="site-c")
        self.assertIn("does not list site-c in readers", answer.error)
        self.assert_nothing_sent()

    def test_local_sources_in_a_remote_request_are_refused(self):
        self.source_tree()
        answer = self.submit("site-b", "step-100",
                             sources=[os.path.join(self.sites.export("site-a"), "step-100")])
        self.assertFalse(answer.ok())
        self.assert_nothing_sent()

    def test_a_reader_sees_and_cancels_only_its_own_transfers(self):
        self.source_tree()
        # A real pull by site-b: a crafted one that site-b's daemon did not
        # ask for is refused by site-b before site-a submits it.
        proc, out = self.copy("b", "site-a:/ckpt/step-100", "site-b:/ckpt/got", wait=False)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        tid = out["id"]
        channel = self.hostile("site-c")
        try:
            self.assertEqual(channel.remote_get(tid).error_code, 5)  # NOT_FOUND
            self.assertEqual(channel.remote_cancel(tid).error_code, 5)
        finally:
            channel.close()
        channel = self.hostile("site-b")
        try:
            self.assertTrue(channel.remote_get(tid).ok())
        finally:
            channel.close()


class PullResumeTest(PullTestCase):
    writers = "site-b="
    readers = "site-a=site-b"

    def start_big_pull(self):
        src = os.path.join(self.sites.export("site-a"), "big")
        for i in range(3):
            lh.write_random(os.path.join(src, f"shard_{i}.bin"), 128 * MIB, seed=i)
        proc, out = self.copy("b", "site-a:/ckpt/big", "site-b:/ckpt/big", "--chunk-size", "8MiB",
                              "--streams", str(STREAMS), wait=False)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return src, out["id"]

    def wait_progress(self, tid, fraction):
        deadline = time.time() + 120
        while time.time() < deadline:
            s = self.sites.status("a", tid)
            if s["bytes"] and s["bytes_done"] >= fraction * s["bytes"]:
                return
            if s["state"] == "COMPLETED":
                self.fail("the pull finished before the crash point; make it larger")
            time.sleep(0.02)
        self.fail("no progress")

    def finish(self, src, tid, min_attempts):
        done = self.sites.wait_state("b", tid, {"COMPLETED", "FAILED"}, timeout=300)
        self.assertEqual(done["state"], "COMPLETED", done.get("error"))
        self.assertEqual(lh.tree_digest(src), lh.tree_digest(self.dest("big")))
        at_a = self.sites.status("a", tid)
        self.assertEqual(at_a["state"], "COMPLETED")
        # Nothing durable was sent again: at most one chunk per stream.
        self.assertLessEqual(at_a["resent_bytes"], STREAMS * CHUNK)
        self.assertGreaterEqual(at_a["attempts"], min_attempts)

    def test_pull_resumes_after_the_destination_is_sigkilled(self):
        src, tid = self.start_big_pull()
        self.wait_progress(tid, 0.3)
        self.sites.kill("site-b")
        self.sites.up()  # restarts site-b, which still grants the pull from its journal
        self.finish(src, tid, min_attempts=2)

    def test_pull_resumes_after_the_source_is_sigkilled(self):
        src, tid = self.start_big_pull()
        self.wait_progress(tid, 0.3)
        self.sites.kill("site-a")
        self.sites.up()  # restarts site-a, which resumes the push from its journal
        self.finish(src, tid, min_attempts=1)


if __name__ == "__main__":
    unittest.main()
