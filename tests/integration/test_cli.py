"""The operator's CLI: what it draws on a real terminal (tmux), its exit
codes (one test per row of README's table), its arguments and units, id
prefixes, `ls` filters, and what Ctrl-C on `cp --wait` says."""

import json
import os
import shlex
import signal
import subprocess
import time
import unittest

import lh

CLI = os.path.join(lh.BIN, "longhaul")


class CliTestCase(lh.SitesTestCase):

    def setUp(self):
        super().setUp()
        self.src = self.sites.path("src")
        lh.write_random(os.path.join(self.src, "blob.bin"), 1 << 20, seed=1)

    def cli(self, *args, **kw):
        return self.sites.cli("a", *args, **kw)

    def assert_exit(self, code, *args):
        proc = self.cli(*args)
        self.assertEqual(proc.returncode, code, f"{args}: {proc.stdout}{proc.stderr}")
        return proc

    def copied(self, dest="site-b:/ckpt/x", *extra):
        proc = self.assert_exit(0, "cp", self.src, dest, "--wait", "--json", *extra)
        return json.loads(proc.stdout)

    def failed(self):
        """A transfer that FAILED at the destination: submitted while site-b
        was down, so that site-b could not refuse it before submit, then
        refused when it opened (an unknown export)."""
        self.sites.kill("site-b")
        tid = self.assert_exit(0, "cp", self.src, "site-b:/nope/x").stdout.strip()
        self.sites.up()
        self.sites.wait_state("a", tid, {"FAILED", "COMPLETED"})
        proc = self.assert_exit(1, "status", tid, "--watch", "--json")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        self.assertEqual(result["state"], "FAILED", result)
        return result


class TerminalTest(CliTestCase):
    """`cp --wait` in a tmux pane of 40, 80 and 200 columns: no line of the
    pane is longer than the pane, and the bar stays on one line while it
    updates."""

    def setUp(self):
        super().setUp()
        lh.write_random(os.path.join(self.src, "big.bin"), 24 << 20, seed=2)
        self.socket = self.sites.path("tmux.sock")
        self.addCleanup(subprocess.run, ["tmux", "-S", self.socket, "kill-server"],
                        capture_output=True)

    def tmux(self, *args):
        return subprocess.run(["tmux", "-S", self.socket, *args], check=True,
                              capture_output=True, text=True).stdout

    def run_in_pane(self, width, *args):
        daemon = self.sites.env["LONGHAUL_SITE_A"]
        command = shlex.join([CLI, "--daemon", daemon, *args])
        # The pane outlives the CLI, so that its last screen can be read.
        self.tmux("new-session", "-d", "-s", "cli", "-x", str(width), "-y", "40",
                  f"{command}; echo EXIT=$?; exec sleep 600")

    def screen(self, width):
        """The pane's lines, wrapped lines joined, after checking them."""
        lines = [l.rstrip() for l in self.tmux("capture-pane", "-p", "-J", "-t", "cli").splitlines()]
        for line in lines:
            self.assertLessEqual(len(line), width, f"wrapped at {width} columns: {line!r}")
        bars = [l for l in lines if l.startswith("[")]
        self.assertLessEqual(len(bars), 1, f"the bar left copies at {width} columns: {lines}")
        return lines

    def follow(self, width, *args):
        """Runs the CLI in a pane; returns the screens seen while the bar was
        drawn and the last screen."""
        self.run_in_pane(width, *args)
        with_bar = []

        def ended():
            lines = self.screen(width)
            done = any(l.startswith("EXIT=") for l in lines)
            if not done and any(l.startswith("[") for l in lines):
                with_bar.append(lines)
            return lines if done else None

        last = lh.wait_until(ended, 180, "the CLI in tmux to exit", interval=0.02)
        return with_bar, last

    def check_width(self, width):
        self.assert_exit(0, "limit", "--peer", "site-b", "64Mbit")
        with_bar, last = self.follow(width, "cp", self.src, "site-b:/ckpt/x", "--wait")
        self.assertIn("EXIT=0", last, last)
        self.assertTrue(with_bar, f"no progress bar seen at {width} columns: {last}")
        self.assertTrue(any(l.startswith("transfer t-") and "submitted" in l for l in last), last)
        self.assertTrue(any("completed" in l for l in last), last)

    def test_bar_fits_40_columns(self):
        self.check_width(40)

    def test_bar_fits_80_columns(self):
        self.check_width(80)

    def test_bar_fits_200_columns(self):
        self.check_width(200)

    def test_failed_transfer_shows_no_rate(self):
        failed = self.failed()
        _, last = self.follow(80, "status", failed["id"], "--watch")
        self.assertIn("EXIT=1", last, last)
        screen = "\n".join(last)
        self.assertIn("FAILED", screen)
        self.assertNotIn("Mbit/s", screen)


class ExitCodeTest(CliTestCase):
    """One test per row of README's exit-code table."""

    def test_0_ok(self):
        self.assertEqual(self.copied()["state"], "COMPLETED")

    def test_1_transfer_failed_or_verify_mismatch(self):
        self.failed()
        done = self.copied("site-b:/ckpt/y")
        with open(os.path.join(self.sites.export("site-b"), "y", "blob.bin"), "r+b") as f:
            f.write(b"changed")
        self.assert_exit(1, "verify", done["id"])

    def test_2_usage_errors_and_refusals(self):
        done = self.copied()
        for args in (
                ["cp", self.src],                                    # no destination
                ["limit", "--peer", "site-x", "100Mbit"],            # unknown peer
                ["limit", "--class", "background", "100"],           # a rate with no unit
                ["cp", self.src, "site-z:/ckpt/x"],                  # refused at submit
                ["cp", self.src, "site-a:/ckpt/x"],                  # the local site
                ["status", "t-nonexistent"],                         # no such transfer
                ["pause", done["id"]],                               # ended: cannot be paused
                ["ls", "--since", "yesterday"],
        ):
            self.assert_exit(2, *args)

    def test_3_daemon_unreachable_is_reported_at_once(self):
        missing = self.sites.path("nowhere", "control.sock")
        proc = subprocess.run([CLI, "--daemon", missing, "ls"], capture_output=True, text=True,
                              timeout=60)
        self.assertEqual(proc.returncode, 3, proc.stderr)
        self.assertIn(f"there is no socket {missing}", proc.stderr)
        self.assertIn("start the daemon", proc.stderr)

    def test_plain_socket_path_names_the_daemon(self):
        path = self.sites.env["LONGHAUL_SITE_A"].removeprefix("unix:")
        proc = subprocess.run([CLI, "--daemon", path, "ls"], capture_output=True, text=True,
                              timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)

    def test_copy_to_the_local_site_says_so(self):
        proc = self.assert_exit(2, "cp", self.src, "site-a:/ckpt/x")
        self.assertIn("site-a is the local site", proc.stderr)


class ArgumentsTest(CliTestCase):
    site_names = ("site-a", "site-b", "site-c")

    def test_repeatable_options_leave_the_positionals(self):
        proc = self.assert_exit(0, "cp", "--commit-last", "*.json", "--also", "site-c:/ckpt/x",
                                self.src, "site-b:/ckpt/x", "--wait")
        for site in ("site-b", "site-c"):
            self.assertTrue(os.path.exists(os.path.join(self.sites.export(site), "x", "blob.bin")),
                            proc.stdout)

    def test_missing_positionals_say_an_option_may_have_taken_them(self):
        proc = self.assert_exit(2, "cp", "--also", "site-c:/ckpt/x")
        self.assertIn("an option given a value may have taken", proc.stderr)

    def test_rates_bits_and_bytes(self):
        for text, bps in (("100Mbit", 100_000_000), ("1Gbps", 1_000_000_000),
                          ("100MB/s", 800_000_000), ("50MiB/s", 50 * 8 << 20),
                          ("10Gbit", 10_000_000_000)):
            out = json.loads(self.assert_exit(0, "limit", "--class", "background", text,
                                              "--json").stdout)
            self.assertEqual(out["limits"], [{"class": "background", "bits_per_second": bps}])
        proc = self.assert_exit(2, "limit", "--class", "background", "100")
        self.assertIn("write 100Mbit (bits) or 100MB/s (bytes)", proc.stderr)
        proc = self.assert_exit(2, "limit", "--peer", "site-b", "1kbit")
        self.assertIn("accepted: 0.064 to 10000000 Mbit/s", proc.stderr)

    def test_sizes(self):
        proc = self.assert_exit(2, "cp", self.src, "site-b:/ckpt/x", "--chunk-size", "4096")
        self.assertIn("write 4096B for bytes", proc.stderr)
        proc = self.assert_exit(2, "cp", self.src, "site-b:/ckpt/x", "--chunk-size", "4KiB")
        self.assertIn("accepted: 64 to 1048576 KiB", proc.stderr)
        self.copied("site-b:/ckpt/x", "--chunk-size", "1M")


class ListAndPrefixTest(CliTestCase):

    def test_ls_shows_ended_transfers_of_the_last_day(self):
        ok, bad = self.copied(), self.failed()
        listed = self.assert_exit(0, "ls").stdout
        self.assertIn(ok["id"], listed)
        self.assertIn(bad["id"], listed)
        failed = json.loads(self.assert_exit(0, "ls", "--failed", "--json").stdout)
        self.assertEqual([t["id"] for t in failed["transfers"]], [bad["id"]])
        self.assertEqual(self.assert_exit(0, "ls", "--since", "1d", "-q").stdout.split(),
                         sorted([ok["id"], bad["id"]], key=listed.index))
        # Ended before "0 s ago": not within the window, but in --all.
        self.assertNotIn(ok["id"], self.assert_exit(0, "ls", "--since", "0s").stdout)
        self.assertIn(ok["id"], self.assert_exit(0, "ls", "--all").stdout)

    def test_id_prefixes(self):
        a, b = self.copied("site-b:/ckpt/x"), self.copied("site-b:/ckpt/y")
        common = os.path.commonprefix([a["id"], b["id"]])
        unique = a["id"][:len(common) + 1]
        status = json.loads(self.assert_exit(0, "status", unique, "--json").stdout)
        self.assertEqual(status["id"], a["id"])
        self.assert_exit(0, "verify", unique)
        proc = self.assert_exit(2, "status", common)
        self.assertIn(a["id"], proc.stderr)
        self.assertIn(b["id"], proc.stderr)

    def test_status_names_source_destination_and_error(self):
        bad = self.failed()
        text = self.assert_exit(0, "status", bad["id"]).stdout
        self.assertIn(f"source:      {self.src}", text)
        self.assertIn("destination: site-b:/nope/x", text)
        self.assertIn(f"error:       {bad['error']}", text)
        self.assertNotIn("Mbit/s", text)

    def test_quiet_prints_only_the_id(self):
        proc = self.assert_exit(0, "cp", "-q", self.src, "site-b:/ckpt/x", "--wait")
        self.assertRegex(proc.stdout, r"^t-[0-9a-f]+\n$")
        self.assertEqual(proc.stderr, "")

    def test_sync_keep_names_each_checkpoint(self):
        runs = self.sites.path("runs")
        for step in ("step-1", "step-2", "step-3"):
            lh.write_random(os.path.join(runs, step, "DONE"), 10, seed=3)
        proc = self.assert_exit(0, "sync", "--keep", "2", "--only-complete", "DONE", runs,
                                "site-b:/ckpt/runs")
        names = [line.split()[-1] for line in proc.stdout.splitlines()]
        self.assertEqual(names, ["step-2", "step-3"], proc.stdout)


class InterruptTest(CliTestCase):

    def test_ctrl_c_says_the_copy_goes_on(self):
        lh.write_random(os.path.join(self.src, "big.bin"), 8 << 20, seed=4)
        self.assert_exit(0, "limit", "--peer", "site-b", "16Mbit")
        daemon = self.sites.env["LONGHAUL_SITE_A"]
        proc = subprocess.Popen([CLI, "--daemon", daemon, "cp", self.src, "site-b:/ckpt/x",
                                 "--wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        self.addCleanup(proc.kill)
        tid = lh.wait_until(lambda: self.assert_exit(0, "ls", "-q").stdout.strip(), 60,
                            "the transfer to be listed", interval=0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 130, err)
        self.assertIn(f"transfer {tid} goes on at the daemon", err)
        self.assertIn(f"status --watch {tid}", err)
        self.assertIn(f"cancel {tid}", err)
        self.assert_exit(0, "limit", "--peer", "site-b", "off")
        self.assertEqual(self.sites.wait_state("a", tid, {"COMPLETED", "FAILED"})["state"],
                         "COMPLETED")


if __name__ == "__main__":
    unittest.main()
