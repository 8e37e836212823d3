"""Who may do what in an export (ctest label `security`): hostile peers with
valid site certificates (hostile_peer.py) and real daemons try to write
where they are not listed, to replace what another site published, to make
the receiver prune what is not theirs, and to publish setuid or
world-writable files. Each is refused with an error that names the export
and the peer, nothing is written, and the refusal is logged and counted in
/metrics; or, for modes, the files arrive masked."""

import json
import os
import shutil
import stat
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import lh  # noqa: E402

import hostile_peer  # noqa: E402

MARKER = "model.index.json"


class AccessTestCase(lh.AccessTestCase):
    site_names = ("site-a", "site-b", "site-c")

    # -- helpers ----------------------------------------------------------

    def export(self, *parts):
        return os.path.join(self.sites.export("site-b"), *parts)

    def hostile(self, site):
        with open(self.sites.path("site-b", "longhauld.yaml")) as f:
            listen = [l for l in f if l.startswith("listen:")][0].split()[1]
        return hostile_peer.HostilePeer(self.sites.path("pki"), site, listen, "site-b")

    def visible_entries(self):
        """Everything in site-b's export outside .longhaul, and the staging dirs."""
        found = []
        for dirpath, dirs, files in os.walk(self.export()):
            rel = os.path.relpath(dirpath, self.export())
            found += [os.path.normpath(os.path.join(rel, n)) for n in dirs + files]
        return sorted(p for p in found if p not in (".longhaul", ".longhaul/staging"))

    def wait_log(self, site, needle, timeout=10):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if needle in self.sites.log(site):
                return
            time.sleep(0.05)
        self.fail(f"{site} log never said {needle!r}:\n{self.sites.log(site)[-3000:]}")

    def cp(self, site, src, dest, *flags):
        proc = self.sites.cli(site[-1], "cp", src, dest, "--wait", "--json", *flags)
        result = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
        return proc, result

    def cp_ok(self, site, src, dest):
        proc, result = self.cp(site, src, dest)
        self.assertEqual((proc.returncode, result.get("state")), (0, "COMPLETED"),
                         proc.stderr + proc.stdout)
        return result

    def assert_refused_at_submit(self, proc, result, *needles):
        """A real daemon asks the destination before submit returns an id:
        its refusal is exit 2 with the destination's words on stderr."""
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        self.assertEqual(result, {}, proc.stdout)
        for needle in needles:
            self.assertIn(needle, proc.stderr)

    def assert_refused(self, answer, *needles):
        self.assertFalse(answer.ok(), "the receiver accepted it")
        self.assertEqual(answer.error_code, hostile_peer.PERMISSION_DENIED, answer.error)
        self.assertFalse(answer.retryable, answer.error)
        for needle in needles:
            self.assertIn(needle, answer.error)

    def make_checkpoint(self, root, name, seed):
        for i in range(2):
            lh.write_random(os.path.join(root, name, f"shard-{i}.pt"), 100_000, seed=seed * 10 + i)
        with open(os.path.join(root, name, MARKER), "w") as f:
            json.dump({"step": name}, f)
        return os.path.join(root, name)


class ExportWritersTest(AccessTestCase):
    """site-b's export: writers [site-a], readers [site-c]."""

    writers = "site-b=site-a"
    readers = "site-b=site-c"

    def test_a_reader_that_is_not_a_writer_is_refused_and_nothing_is_written(self):
        peer = self.hostile("site-c")
        files = {"x.bin": (os.urandom(1000), 0o644)}
        answer = peer.publish("t-reader", "ckpt", "stolen", files)
        self.assert_refused(answer, "site-c", "export ckpt", "writers")
        self.assertEqual(self.visible_entries(), [])
        self.assertFalse(os.path.exists(self.export(".longhaul", "staging", "t-reader")))
        self.wait_log("site-b", "refused request from site-c for transfer t-reader")
        self.assertEqual(self.sites.metric("site-b", "longhaul_export_access_refused_total",
                                     {"peer": "site-c", "export": "ckpt"}), 1)

        # A real daemon gets the same answer, before its submit returns an id.
        src = self.sites.path("src.bin")
        lh.write_random(src, 4096, seed=1)
        proc, result = self.cp("site-c", src, "site-b:/ckpt/stolen.bin")
        self.assert_refused_at_submit(proc, result, "site-c may not write into export ckpt")
        self.assertEqual(self.visible_entries(), [])
        self.assertEqual(self.sites.metric("site-b", "longhaul_export_access_refused_total",
                                     {"peer": "site-c", "export": "ckpt"}), 2)

        # The writer still can.
        self.cp_ok("site-a", src, "site-b:/ckpt/ok.bin")

    def test_site_c_cannot_touch_a_checkpoint_site_a_published(self):
        ckpt = self.make_checkpoint(self.sites.path("src"), "step-1", seed=1)
        done = self.cp_ok("site-a", ckpt, "site-b:/ckpt/run1/step-1")
        before = lh.tree_digest(self.export("run1"))

        peer = self.hostile("site-c")
        model = {"shard-0.pt": (b"poisoned" * 1000, 0o644)}
        self.assert_refused(peer.publish("t-over-file", "ckpt", "run1/step-1/shard-0.pt", model,
                                         single_file=True), "site-c", "ckpt")
        self.assert_refused(peer.publish("t-over-tree", "ckpt", "run1", model), "site-c", "ckpt")
        # Commit, abort and verify of site-a's transfer: it is not site-c's.
        control = peer.control(done["id"])
        try:
            for answer in (control.commit(done["id"]), control.abort(done["id"]),
                           control.verify(done["id"])):
                self.assertFalse(answer.ok(), answer)
                self.assertIn(done["id"], answer.error)
        finally:
            control.close()

        self.assertEqual(lh.tree_digest(self.export("run1")), before)
        verify = self.sites.cli("a", "verify", done["id"], "--json")
        self.assertEqual(verify.returncode, 0, verify.stdout + verify.stderr)

    def test_setuid_and_world_writable_modes_arrive_masked(self):
        peer = self.hostile("site-a")
        body = b"#!/bin/sh\nid\n"
        files = {
            "bin/id": (body, 0o6755),
            "bin/sticky": (body, 0o1777),
            "world-writable": (body, 0o777),
            "group-writable": (body, 0o664),
            "setgid-private": (body, 0o2750),
            "private": (body, 0o600),
        }
        answer = peer.publish("t-modes", "ckpt", "tools", files)
        self.assertTrue(answer.ok(), answer)
        modes = {rel: stat.S_IMODE(os.lstat(self.export("tools", rel)).st_mode) for rel in files}
        self.assertEqual(modes, {"bin/id": 0o755, "bin/sticky": 0o755, "world-writable": 0o755,
                                 "group-writable": 0o644, "setgid-private": 0o750,
                                 "private": 0o600})
        for d in ("tools", "tools/bin"):
            self.assertEqual(stat.S_IMODE(os.lstat(self.export(d)).st_mode), 0o755, d)
        daemon = os.stat(f"/proc/{self.sites.pid('site-b')}")
        for rel in files:
            st = os.lstat(self.export("tools", rel))
            self.assertEqual((st.st_uid, st.st_gid), (daemon.st_uid, daemon.st_gid), rel)

        single = peer.publish("t-mode-file", "ckpt", "id", {"id": (body, 0o4755)}, single_file=True)
        self.assertTrue(single.ok(), single)
        self.assertEqual(stat.S_IMODE(os.lstat(self.export("id")).st_mode), 0o755)

        # The same through a real daemon, from a setuid file at the source.
        src = self.sites.path("setuid-src", "id")
        os.makedirs(os.path.dirname(src))
        with open(src, "wb") as f:
            f.write(body)
        os.chmod(src, 0o6777)
        self.cp_ok("site-a", os.path.dirname(src), "site-b:/ckpt/from-cli")
        self.assertEqual(stat.S_IMODE(os.lstat(self.export("from-cli", "id")).st_mode), 0o755)


class NoWritersTest(AccessTestCase):
    """An export without a writers list accepts nobody."""

    site_names = ("site-a", "site-b")
    writers = "site-b="

    def test_an_export_without_writers_refuses_every_peer(self):
        src = self.sites.path("src.bin")
        lh.write_random(src, 4096, seed=1)
        proc, result = self.cp("site-a", src, "site-b:/ckpt/x.bin")
        self.assert_refused_at_submit(proc, result, "site-a may not write into export ckpt")
        self.assertEqual(self.visible_entries(), [])


class ThirdPartyDeputyTest(AccessTestCase):
    """site-b's export: writers [site-a]; site-a's export: readers [site-c].
    site-c may have site-a copy into site-b (third-party copy), but every
    change at site-b uses site-c's authority as well as site-a's: site-c,
    no writer there, may only have new paths created, never replaced or
    pruned."""

    writers = "site-b=site-a"
    readers = "site-a=site-c"

    def publish_run1(self):
        """site-a's own run1/step-1..3 at site-b; their digests."""
        for step in (1, 2, 3):
            ckpt = self.make_checkpoint(self.sites.path("src"), f"step-{step}", seed=step)
            self.cp_ok("site-a", ckpt, f"site-b:/ckpt/run1/step-{step}")
        return {n: lh.tree_digest(self.export("run1", n)) for n in ("step-1", "step-2", "step-3")}

    def run1(self):
        return {n: lh.tree_digest(self.export("run1", n)) for n in os.listdir(self.export("run1"))}

    def test_a_reader_cannot_have_the_source_replace_its_own_checkpoint(self):
        before = self.publish_run1()
        junk = os.path.join(self.sites.export("site-a"), "junk")
        lh.write_random(os.path.join(junk, "shard-0.pt"), 4096, seed=99)
        proc, result = self.cp("site-c", "site-a:/ckpt/junk", "site-b:/ckpt/run1/step-3")
        self.assertEqual(self.run1(), before)  # step-3 is still site-a's
        self.assert_refused_at_submit(
            proc, result,
            "site-c asked site-a to copy into ckpt:run1/step-3 of site-b, which exists; "
            "site-c is not one of the export's writers, so a copy on its request may "
            "only create a path that does not exist yet")
        self.wait_log("site-b", "refused transfer")

        # A path that does not exist yet it may have site-a create.
        self.cp_ok("site-c", "site-a:/ckpt/junk", "site-b:/ckpt/run1/junk")
        self.assertEqual(lh.tree_digest(self.export("run1", "junk")), lh.tree_digest(junk))

    def test_a_reader_cannot_have_the_source_prune(self):
        before = self.publish_run1()
        self.make_checkpoint(self.sites.export("site-a"), "step-4", seed=4)
        # The CLI takes no --keep with a remote source; a hostile site-c asks
        # site-a itself, which sends with keep_checkpoints=1.
        with open(self.sites.path("site-a", "longhauld.yaml")) as f:
            listen = [line for line in f if line.startswith("listen:")][0].split()[1]
        channel = hostile_peer.HostilePeer(self.sites.path("pki"), "site-c", listen,
                                           "site-a").remote()
        try:
            answer = channel.remote_submit("req-keep", hostile_peer.transfer_spec(
                "ckpt", "step-4", "site-b", "ckpt", "run1/step-4", keep_checkpoints=1,
                checkpoint_marker=MARKER))
        finally:
            channel.close()
        # site-a asks site-b before it submits: refused, and nothing is sent.
        self.assertFalse(answer.ok(), answer)
        self.assertIn("site-c asked site-a to prune old checkpoints in export ckpt of site-b "
                      "(--keep), but site-c is not one of the export's writers, so a copy on its "
                      "request never prunes", answer.error)
        self.assertEqual(self.run1(), before)  # step-1 and step-2 are still there
        listed = json.loads(self.sites.cli("a", "ls", "--all", "--json", check=True).stdout)
        self.assertEqual([t for t in listed["transfers"] if t.get("requested_by") == "site-c"], [])


class PullSourceTest(AccessTestCase):
    """site-b pulls from site-a and lets nobody write into its export. The
    pull grants site-a one path and one transfer, never pruning."""

    site_names = ("site-a", "site-b")
    writers = "site-b="
    readers = "site-a=site-b"

    def test_a_pulls_source_cannot_prune_the_earlier_pulls(self):
        run = os.path.join(self.sites.export("site-a"), "run")
        for step in (1, 2):
            self.make_checkpoint(run, f"step-{step}", seed=step)
            self.cp_ok("site-b", f"site-a:/ckpt/run/step-{step}", f"site-b:/ckpt/run/step-{step}")
        before = {n: lh.tree_digest(self.export("run", n)) for n in ("step-1", "step-2")}
        # A pull that runs long enough for site-a to open it itself.
        lh.write_random(os.path.join(run, "step-3", "shard.bin"), 256 << 20, seed=3)
        with open(os.path.join(run, "step-3", MARKER), "w") as f:
            f.write("{}")
        self.sites.cli("a", "limit", "--peer", "site-b", "50Mbit", check=True)
        proc = self.sites.cli("b", "cp", "site-a:/ckpt/run/step-3", "site-b:/ckpt/run/step-3",
                              "--json")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        tid = json.loads(proc.stdout)["id"]
        self.sites.wait_state("a", tid, {"RUNNING"})
        # Paused at the source: the pull still runs, so its grant holds.
        self.sites.cli("a", "pause", tid, check=True)
        self.sites.wait_state("a", tid, {"PAUSED"})

        peer = self.hostile("site-a")
        files = {"shard.bin": (b"x" * 1000, 0o644), MARKER: (b"{}", 0o644)}
        answer = peer.publish(tid, "ckpt", "run/step-3", files, keep_checkpoints=1,
                              checkpoint_marker=MARKER, requested_by="site-b")
        self.assertEqual(sorted(os.listdir(self.export("run"))), ["step-1", "step-2"])
        self.assertEqual({n: lh.tree_digest(self.export("run", n)) for n in before}, before)
        self.assert_refused(answer, "site-a may not prune old checkpoints in export ckpt of "
                            "site-b", "no pruning")
        self.sites.cli("b", "cancel", tid, check=True)


class SharedExportTest(AccessTestCase):
    """site-a and site-c are both writers of site-b's export. Each may
    publish new paths; neither may replace, or write inside, a destination
    the other published (while it exists), and retention removes only the
    pruning site's own checkpoints."""

    def test_keep_1_from_site_c_never_removes_site_a_checkpoints(self):
        run_a = self.sites.path("run-a")
        for step in (1, 2):
            self.make_checkpoint(run_a, f"step-{step}", seed=step)
        sync = self.sites.cli("a", "sync", run_a, "site-b:/ckpt/run1", "--wait", "--json",
                              "--keep", "3", "--only-complete", MARKER)
        self.assertEqual(sync.returncode, 0, sync.stderr)
        # A checkpoint no peer published (copied in by an operator).
        local = self.make_checkpoint(self.export("run1"), "step-0", seed=9)
        a_before = {n: lh.tree_digest(self.export("run1", n)) for n in ("step-0", "step-1", "step-2")}

        run_c = self.sites.path("run-c")
        self.make_checkpoint(run_c, "step-5", seed=5)
        sync = self.sites.cli("c", "sync", run_c, "site-b:/ckpt/run1", "--wait", "--json",
                              "--keep", "1", "--only-complete", MARKER)
        self.assertEqual(sync.returncode, 0, sync.stderr)
        self.assertEqual(sorted(os.listdir(self.export("run1"))),
                         ["step-0", "step-1", "step-2", "step-5"])
        # site-c's own older checkpoint does go.
        self.make_checkpoint(run_c, "step-6", seed=6)
        sync = self.sites.cli("c", "sync", run_c, "site-b:/ckpt/run1", "--wait", "--json",
                              "--keep", "1", "--only-complete", MARKER)
        self.assertEqual(sync.returncode, 0, sync.stderr)
        self.assertEqual(sorted(os.listdir(self.export("run1"))),
                         ["step-0", "step-1", "step-2", "step-6"])
        self.assertEqual({n: lh.tree_digest(self.export("run1", n)) for n in a_before}, a_before)
        self.assertTrue(os.path.isdir(local))

        # The hostile form: an open with keep_checkpoints=1 and a marker glob
        # that every directory of the export matches.
        peer = self.hostile("site-c")
        answer = peer.publish("t-prune", "ckpt", "run1/zzz", {MARKER: (b"{}", 0o644)},
                              keep_checkpoints=1, commit_last=["*"])
        self.assertTrue(answer.ok(), answer)
        self.assertEqual(sorted(os.listdir(self.export("run1"))),
                         ["step-0", "step-1", "step-2", "zzz"])
        self.assertEqual({n: lh.tree_digest(self.export("run1", n)) for n in a_before}, a_before)

    def test_a_writer_cannot_replace_what_another_writer_published(self):
        ckpt = self.make_checkpoint(self.sites.path("src"), "step-1", seed=1)
        done = self.cp_ok("site-a", ckpt, "site-b:/ckpt/run1/step-1")
        before = lh.tree_digest(self.export("run1"))

        peer = self.hostile("site-c")
        model = {"shard-0.pt": (b"poisoned" * 1000, 0o644)}
        for dest, single in (("run1/step-1/shard-0.pt", True), ("run1/step-1", False),
                             ("run1", False), ("run1/step-1/new/file", True)):
            answer = peer.publish(f"t-{len(dest)}", "ckpt", dest, model, single_file=single)
            self.assert_refused(answer, "site-c", "another site")
            self.assertNotIn("site-a", answer.error)  # who published it is not site-c's business
        self.assertEqual(lh.tree_digest(self.export("run1")), before)
        self.assertEqual(self.sites.metric("site-b", "longhaul_export_access_refused_total",
                                     {"peer": "site-c", "export": "ckpt"}), 4)

        # Through a real daemon: refused before submit saying why, without the owner's name.
        proc, result = self.cp("site-c", self.sites.path("src", "step-1"), "site-b:/ckpt/run1/step-1")
        self.assert_refused_at_submit(proc, result, "published by another site")
        self.assertNotIn("site-a", proc.stderr)

        # Beside it is fine, and site-a may replace its own.
        self.assertTrue(peer.publish("t-beside", "ckpt", "run1/step-9", model).ok())
        self.cp_ok("site-a", ckpt, "site-b:/ckpt/run1/step-1")
        verify = self.sites.cli("a", "verify", done["id"], "--json")
        self.assertEqual(verify.returncode, 0, verify.stdout + verify.stderr)

        # Once site-a's checkpoint is gone, the path is free again.
        shutil.rmtree(self.export("run1", "step-1"))
        self.assertTrue(peer.publish("t-after", "ckpt", "run1/step-1", model).ok())


class ReportNamesTest(AccessTestCase):
    """site-b's export: every site a writer, readers [site-a]. What a publish
    replaced or deleted is named only to a source that may know the
    destination; site-c learns counts."""

    readers = "site-b=site-a"

    def test_a_writer_that_may_not_read_learns_counts_not_names_of_what_it_replaces(self):
        # An operator's directory: no peer published it, and site-c is a
        # writer of the export but not a reader. A dry run and a sync that
        # replace it tell site-c how many files went, never their names.
        opdir = self.export("opdir")
        os.makedirs(opdir)
        for i in range(3):
            with open(os.path.join(opdir, f"secret-name-{i}"), "wb") as f:
                f.write(b"operator's")
        src = self.sites.path("src-c")
        os.makedirs(src)
        with open(os.path.join(src, "weights.bin"), "wb") as f:
            f.write(b"site-c's")
        for extra in (("--dry-run",), ("--wait",)):
            proc = self.sites.cli("c", "sync", src, "site-b:/ckpt/opdir", "--json", *extra)
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
            self.assertNotIn("secret-name", proc.stdout + proc.stderr)
            report = json.loads(proc.stdout.strip().splitlines()[-1])["report"]
            self.assertEqual((report["deleted"], report["deleted_count"]), ([], 3), report)
        self.assertEqual(os.listdir(opdir), ["weights.bin"])


class HostileRelayTest(AccessTestCase):
    """Fan-out: only the site the owner's open names as relay may attach and
    send chunks; it may neither commit nor abort; a later open without it
    takes that right away. site-a is the owner, site-b the receiver."""

    def open(self, peer, tid, **open_args):
        control = peer.control(tid)
        m = hostile_peer.manifest([hostile_peer.manifest_file("x.bin", 1000)])
        return control, control.open(tid, "ckpt", "relayed", m, single_file=True, **open_args)

    def test_a_relay_must_be_another_writer_named_by_the_owner(self):
        owner = self.hostile("site-a")
        for relay, why in (("site-a", "relay_by must name another destination"),
                           ("site-b", "relay_by must name another destination"),
                           ("site-z", "relay refused")):
            control, answer = self.open(owner, "t-bad-relay", relay_by=relay)
            control.close()
            self.assertFalse(answer.ok(), relay)
            self.assertIn(why, answer.error)
        for target in (("site-b", "t-next"), ("site-a", "t-next"), ("site-c", "../x")):
            control, answer = self.open(owner, "t-bad-relay", relay_to=target)
            control.close()
            self.assertFalse(answer.ok(), target)
        self.assertEqual(self.visible_entries(), [])

    def test_only_the_named_relay_attaches_sends_and_it_never_commits(self):
        owner, relay = self.hostile("site-a"), self.hostile("site-c")
        content = os.urandom(1000)
        # Opened without a relay: site-c may not attach nor send chunks.
        control, answer = self.open(owner, "t-fan")
        self.assertTrue(answer.ok(), answer)
        impostor = relay.control("t-fan")
        self.assert_refused(impostor.relay_attach("t-fan", "site-a"), "not relayed by site-c")
        self.assert_refused(impostor.progress("t-fan"), "belongs to another site")
        impostor.close()
        data = relay.connect(hostile_peer.ROLE_DATA, "t-fan")
        with self.assertRaises((ConnectionError, OSError, ValueError)):
            data.send_chunk(0, 0, content)
        data.close()
        control.close()

        # Opened naming site-c: it attaches and sends, and only the owner commits.
        control, answer = self.open(owner, "t-fan", relay_by="site-c")
        self.assertTrue(answer.ok(), answer)
        self.assertTrue(control.progress("t-fan", [(0, 0, 0, content)]).ok())
        by_relay = relay.control("t-fan")
        self.assertTrue(by_relay.relay_attach("t-fan", "site-a").ok())
        data = relay.connect(hostile_peer.ROLE_DATA, "t-fan")
        self.assertEqual(data.send_chunk(0, 0, content)[0], hostile_peer.ACK_DURABLE)
        data.close()
        self.assert_refused(by_relay.commit("t-fan"), "belongs to another site")
        self.assert_refused(by_relay.abort("t-fan"), "belongs to another site")
        self.assertFalse(os.path.exists(self.export("relayed")))
        by_relay.close()

        # The owner opens again without it: the relay loses its right.
        control.close()
        control, answer = self.open(owner, "t-fan")
        self.assertTrue(answer.ok(), answer)
        by_relay = relay.control("t-fan")
        self.assert_refused(by_relay.relay_attach("t-fan", "site-a"), "not relayed by site-c")
        by_relay.close()
        self.assertTrue(control.commit("t-fan").ok())
        control.close()
        with open(self.export("relayed"), "rb") as f:
            self.assertEqual(f.read(), content)


class RelayDeputyTest(AccessTestCase):
    """Fan-out: a writer of site-b cannot aim site-b's relaying at another
    site's transfer. site-a (hostile, as owner) opens t-victim at site-c
    naming site-b its relay; site-d (hostile) opens a transfer of its own at
    site-b whose relay_to names t-victim. site-b, a real daemon, relays it
    and attaches for site-d; site-c refuses the attach, so none of site-d's
    bytes reach site-a's transfer and site-b stays site-a's relay."""

    site_names = ("site-a", "site-b", "site-c", "site-d")

    def peer(self, site, target):
        with open(self.sites.path(target, "longhauld.yaml")) as f:
            listen = [line for line in f if line.startswith("listen:")][0].split()[1]
        return hostile_peer.HostilePeer(self.sites.path("pki"), site, listen, target)

    def test_a_relay_aimed_at_another_sites_transfer_is_refused_at_attach(self):
        size = hostile_peer.MIN_CHUNK_SIZE
        good, evil = os.urandom(size), os.urandom(size)
        m = hostile_peer.manifest([hostile_peer.manifest_file("x.bin", size)])
        owner = self.peer("site-a", "site-c").control("t-victim")
        self.addCleanup(owner.close)
        opened = owner.open("t-victim", "ckpt", "victim.bin", m, single_file=True,
                            relay_by="site-b")
        self.assertTrue(opened.ok(), opened)
        self.assertTrue(owner.progress("t-victim", [(0, 0, 0, good)]).ok())

        answer = self.peer("site-d", "site-b").publish(
            "t-aimed", "ckpt", "aimed.bin", {"x.bin": (evil, 0o644)}, single_file=True,
            relay_to=("site-c", "t-victim"))
        self.assertTrue(answer.ok(), answer)
        self.wait_log("site-c", "transfer t-victim: relay site-b attaches for site-d, but its "
                                "source is site-a")
        self.wait_log("site-b", "is not relayed by site-b for site-d: the relay_to that aimed it "
                                "here did not come from its source")
        # site-b delivered nothing, so it is not refused as a forger.
        progress = owner.progress("t-victim")
        self.assertTrue(progress.ok(), progress)
        self.assertNotIn(5, progress.body, progress.body.get(5))
        self.assertFalse(os.path.exists(os.path.join(self.sites.export("site-c"), "victim.bin")))


class ForgingRelayTest(AccessTestCase):
    """Fan-out: a relay cannot forge. site-a (hostile here, as owner) opens a
    transfer at site-b naming site-c as its relay, and vouches over its own
    session for the digest of every chunk; site-c (hostile, as relay) sends
    other bytes. site-b takes none of them, refuses site-c from then on,
    tells the owner why, and publishes the owner's bytes once the owner sends
    them itself."""

    CHUNK = hostile_peer.MIN_CHUNK_SIZE

    def open_relayed(self, tid, content, **open_args):
        control = self.hostile("site-a").control(tid)
        m = hostile_peer.manifest([hostile_peer.manifest_file("x.bin", len(content))])
        answer = control.open(tid, "ckpt", tid, m, single_file=True, **open_args)
        self.assertTrue(answer.ok(), answer)
        return control, answer

    def chunks(self, content):
        return [content[i:i + self.CHUNK] for i in range(0, len(content), self.CHUNK)]

    def publish_directly(self, tid, content):
        """The owner's bypass: opens again without the relay, sends the
        chunks site-b does not hold durable, and commits."""
        answer = self.hostile("site-a").publish(tid, "ckpt", tid, {"x.bin": (content, 0o644)},
                                                single_file=True)
        self.assertTrue(answer.ok(), answer)
        with open(self.export(tid), "rb") as f:
            return f.read()

    def test_a_chunk_not_matching_the_owners_digest_is_refused_and_so_is_the_relay(self):
        relay = self.hostile("site-c")
        content = os.urandom(2 * self.CHUNK - 1000)
        pieces = self.chunks(content)
        forged = bytes(b ^ 0x5A for b in pieces[0])
        # The relay's own bytes under their own digest, and other bytes
        # under the digest the owner sent.
        for tid, digest, why in (
                ("t-forged", None, "relay site-c sent chunk 0 of x.bin with a digest that is "
                                   "not the one site-a read from its source"),
                ("t-swapped", hostile_peer.xxh128(pieces[0]),
                 "relay site-c sent chunk 0 of x.bin whose bytes do not hash to the digest "
                 "site-a read")):
            control, _ = self.open_relayed(tid, content, relay_by="site-c")
            vouched = control.progress(tid, [(0, i, 0, p) for i, p in enumerate(pieces)])
            self.assertTrue(vouched.ok(), vouched)
            by_relay = relay.control(tid)
            self.assertTrue(by_relay.relay_attach(tid, "site-a").ok())
            data = relay.connect(hostile_peer.ROLE_DATA, tid)
            result, message = data.send_chunk(0, 0, forged, digest=digest)
            data.close()
            self.assertEqual(result, hostile_peer.ACK_REFUSED, message)
            self.assertIn(why, message)
            # The owner reads why; the relay may not attach again.
            answer = control.progress(tid)
            self.assertTrue(answer.ok(), answer)
            self.assertIn(why, answer.body.get(5, [b""])[0].decode())
            self.assert_refused(by_relay.relay_attach(tid, "site-a"), why)
            by_relay.close()
            control.close()
            self.wait_log("site-b", f"{why}; taking nothing more from site-c")
            # Nothing of it was kept: the owner sends it all, and its bytes are published.
            self.assertEqual(self.publish_directly(tid, content), content)

    def test_a_relayed_chunk_held_at_a_bypass_is_not_kept(self):
        """The relay delivers a chunk before the owner vouched for it; the
        owner then bypasses the relay. site-b kept nothing of it, so the
        owner's open asks for every chunk again."""
        tid = "t-held"
        relay = self.hostile("site-c")
        content = os.urandom(2 * self.CHUNK - 1000)
        forged = bytes(b ^ 0x5A for b in self.chunks(content)[0])
        control, _ = self.open_relayed(tid, content, relay_by="site-c")
        by_relay = relay.control(tid)
        self.assertTrue(by_relay.relay_attach(tid, "site-a").ok())
        data = relay.connect(hostile_peer.ROLE_DATA, tid)
        acks = []

        def send_forged():
            try:
                acks.append(data.send_chunk(0, 0, forged))
            except (ConnectionError, OSError, ValueError) as e:
                acks.append((None, str(e)))

        sender = threading.Thread(target=send_forged)
        sender.start()
        try:
            # Until site-b holds the frame, waiting for the owner's digest
            # (ProgressReply.awaiting_digests), or has answered it.
            deadline = time.time() + 30
            while True:
                answer = control.progress(tid)
                self.assertTrue(answer.ok(), answer)
                if 4 in answer.body or not sender.is_alive():
                    break
                self.assertLess(time.time(), deadline, "site-b never received the relayed chunk")
                time.sleep(0.02)
            control.close()
            self.assertEqual(self.publish_directly(tid, content), content)
        finally:
            sender.join(timeout=60)
            data.close()
            by_relay.close()
        self.assertNotEqual(acks[0][0], hostile_peer.ACK_DURABLE, acks)


if __name__ == "__main__":
    unittest.main()
