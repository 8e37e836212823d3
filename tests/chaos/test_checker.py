"""The chaos checker's checks can fail: each is shown a planted fault (a
mixed version, a wrong-bytes COMPLETED destination, a daemon lost without
the nemesis, a wrong exit code, a crash line, an unexplained FAILED) and
must flag it, and must pass the same situation without the fault."""

import errno
import os
import shutil
import signal
import subprocess
import tempfile
import time
import types
import unittest
import unittest.mock

import checker
import topology

LAYOUT = {"__0_0.distcp": 4096, "extra/00/item_0000.bin": 300, ".metadata": 512}


class CheckerTestCase(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="lh-chaos-check-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.ledger = checker.Ledger()

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def checks(self):
        return [check for check, _ in self.ledger.violations]


class WholeVersionReadTest(CheckerTestCase):
    def observe(self, dest):
        watcher = checker.WholeVersionWatcher(dest, LAYOUT)
        watcher.observe_once()
        return watcher

    def test_whole_version_passes(self):
        checker.lh.write_versioned_checkpoint(self.path("dest"), 7, LAYOUT)
        watcher = self.observe(self.path("dest"))
        self.assertEqual(watcher.violations, [])
        self.assertEqual(watcher.seen, {7: 1})

    def test_planted_mixed_version_is_flagged(self):
        checker.lh.write_versioned_checkpoint(self.path("dest"), 7, LAYOUT)
        checker.lh.write_versioned_checkpoint(self.path("v8"), 8, LAYOUT)
        shutil.copy(self.path("v8", ".metadata"), self.path("dest", ".metadata"))
        watcher = self.observe(self.path("dest"))
        self.assertEqual(list(watcher.kinds), ["mixed v7+v8"], watcher.summary())

    def test_planted_partial_version_is_flagged(self):
        checker.lh.write_versioned_checkpoint(self.path("dest"), 7, LAYOUT)
        os.unlink(self.path("dest", ".metadata"))
        watcher = self.observe(self.path("dest"))
        self.assertEqual(list(watcher.kinds), ["v7 incomplete"], watcher.summary())

    def test_planted_torn_file_is_flagged(self):
        checker.lh.write_versioned_checkpoint(self.path("dest"), 7, LAYOUT)
        with open(self.path("dest", "__0_0.distcp"), "r+b") as f:
            f.seek(2000)
            f.write(b"\0" * 16)
        watcher = self.observe(self.path("dest"))
        self.assertEqual(list(watcher.kinds), ["files of no version"], watcher.summary())

    def test_planted_reader_error_is_flagged_not_swallowed(self):
        # Not a vanished file (ENOENT, or ESTALE on FUSE: an incomplete
        # observation) but an error the reader cannot explain: it stops with
        # a violation instead of a thread that dies unnoticed.
        checker.lh.write_versioned_checkpoint(self.path("dest"), 7, LAYOUT)
        watcher = checker.WholeVersionWatcher(self.path("dest"), LAYOUT)

        def planted(key):
            raise PermissionError(13, "planted")
        watcher._owner = types.SimpleNamespace(get=planted)
        watcher.observe_guarded()
        self.assertEqual(list(watcher.kinds), ["reader failed"], watcher.summary())
        self.assertTrue(watcher.stop_event.is_set())


    def test_a_destination_swapped_while_it_is_opened_is_not_judged(self):
        # On FUSE, opening a name that a publish swapped out meanwhile can
        # answer ESTALE: the observation straddled a change.
        checker.lh.write_versioned_checkpoint(self.path("dest"), 7, LAYOUT)
        watcher = checker.WholeVersionWatcher(self.path("dest"), LAYOUT)
        real_open = os.open

        def stale_once(path, *args, **kwargs):
            if path == self.path("dest") and not watcher.incomplete:
                raise OSError(errno.ESTALE, "Stale file handle", path)
            return real_open(path, *args, **kwargs)
        with unittest.mock.patch("os.open", side_effect=stale_once):
            watcher.observe_guarded()
            watcher.observe_guarded()
        self.assertEqual(watcher.kinds, {}, watcher.summary())
        self.assertEqual((watcher.incomplete, watcher.complete), (1, 1), watcher.summary())


class CompletedDestinationTest(CheckerTestCase):
    def test_right_version_passes(self):
        checker.lh.write_versioned_checkpoint(self.path("dest"), 3, LAYOUT)
        self.assertTrue(self.ledger.verify_destination("cp", self.path("dest"), 3, LAYOUT))
        self.assertEqual(self.ledger.violations, [])

    def test_planted_wrong_bytes_are_flagged(self):
        checker.lh.write_versioned_checkpoint(self.path("dest"), 3, LAYOUT)
        path = self.path("dest", "extra/00/item_0000.bin")
        st = os.stat(path)
        with open(path, "r+b") as f:
            f.write(b"X")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime
        self.assertFalse(self.ledger.verify_destination("cp", self.path("dest"), 3, LAYOUT))
        self.assertEqual(self.checks(), ["completed destination"])

    def test_another_version_is_flagged(self):
        checker.lh.write_versioned_checkpoint(self.path("dest"), 4, LAYOUT)
        self.assertFalse(self.ledger.verify_destination("cp", self.path("dest"), 3, LAYOUT))
        self.assertEqual(self.checks(), ["completed destination"])


class DaemonExitTest(CheckerTestCase):
    """A stand-in daemon (a real child process) through topology.Daemon."""

    def daemon(self, command):
        os.makedirs(self.path("run"), exist_ok=True)
        topo = types.SimpleNamespace(path=self.path)
        d = topology.Daemon(topo, "site-1")
        with open(d.log_path, "w") as f:
            f.write("I1207 00:00:00.000000 1 main.cc:1] serving\n")
        d.proc = subprocess.Popen(command)
        self.addCleanup(lambda: d.proc.poll() is None and (d.proc.kill(), d.proc.wait()))
        return d

    def test_exit_by_the_nemesis_passes(self):
        d = self.daemon(["sleep", "600"])
        d.kill()
        self.ledger.check_exits([d])
        self.assertEqual(self.ledger.violations, [])
        self.assertEqual(d.exits[0][1:], (-signal.SIGKILL, True))

    def test_planted_lost_daemon_is_flagged(self):
        d = self.daemon(["sh", "-c", "exit 3"])
        d.proc.wait()
        self.ledger.check_exits([d])
        self.assertEqual(self.checks(), ["daemon exit"])

    def test_lost_daemon_reaped_by_the_nemesis_is_flagged(self):
        d = self.daemon(["sh", "-c", "kill -SEGV $$"])
        d.proc.wait()
        d.reap()  # what Nemesis.revive_unexpected_exits records
        self.ledger.check_exits([d])
        self.assertEqual(self.checks(), ["daemon exit"])
        self.assertIn(f"exited {-signal.SIGSEGV}", self.ledger.violations[0][1])

    def test_crash_line_in_a_log_is_flagged(self):
        d = self.daemon(["true"])
        self.ledger.check_logs([d])
        self.assertEqual(self.ledger.violations, [])
        with open(d.log_path, "a") as f:
            f.write("F1207 00:00:01.000000 1 journal.cc:88] Check failed: offset <= size\n")
        self.ledger.check_logs([d])
        self.assertEqual(self.checks(), ["daemon log"])


class ExitCodeAndReasonTest(CheckerTestCase):
    def cli(self, rc):
        return subprocess.CompletedProcess(["longhaul"], rc, "", "")

    def test_matching_exit_codes_pass(self):
        self.ledger.check_cli("cp", self.cli(0), ["COMPLETED"])
        self.ledger.check_cli("cp", self.cli(1), ["FAILED"])
        self.ledger.check_cli("sync", self.cli(1), ["COMPLETED", "CANCELLED"])
        self.ledger.check_cli("cp", self.cli(3), [])
        self.assertEqual(self.ledger.violations, [])

    def test_planted_wrong_exit_codes_are_flagged(self):
        self.ledger.check_cli("cp", self.cli(0), ["FAILED"])
        self.ledger.check_cli("cp", self.cli(1), ["COMPLETED"])
        self.ledger.check_cli("sync", self.cli(0), ["COMPLETED", "CANCELLED"])
        self.ledger.check_cli("cp", self.cli(0), [])
        self.assertEqual(self.checks(), ["exit code"] * 4)

    def test_failed_needs_a_reason_and_a_fault(self):
        now = time.time()
        self.ledger.check_failed("t1", "", now - 5, now)
        self.ledger.check_failed("t2", "peer site-2 unreachable", now - 5, now)
        self.assertEqual(self.checks(), ["failed reason", "failed reason"])
        handle = self.ledger.fault_started("partition", "site-2")
        self.ledger.fault_healed(handle)
        self.ledger.check_failed("t3", "peer site-2 unreachable", now - 5, time.time())
        self.assertEqual(len(self.ledger.violations), 2)
        self.assertEqual(self.ledger.failed_reasons, {"(no reason)": 1, "peer unreachable": 2})


if __name__ == "__main__":
    unittest.main()
