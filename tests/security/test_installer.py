"""The installer touches nothing it does not own (ctest label `security`):
deploy/install-deps.sh installs packages and nothing else. It never stops,
disables, masks, restarts or reconfigures a system service, and it does not
install an SSH server, which longhaul does not need.

The installer runs against stub commands on PATH (apt-get, dpkg-query, id,
systemctl, ...) that record how they were called, so the test changes nothing
on the machine that runs it."""

import os
import re
import stat
import subprocess
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
INSTALLER = os.path.join(ROOT, "deploy", "install-deps.sh")
BENCH = os.path.join(ROOT, "tests", "bench")

# Commands that start, stop or reconfigure services.
SERVICE_TOOLS = ("systemctl", "service", "invoke-rc.d", "update-rc.d", "deb-systemd-invoke",
                 "deb-systemd-helper", "chkconfig", "rc-service", "rc-update", "sv")
SERVICE_VERBS = r"(stop|disable|mask|restart|reload|kill|start|enable|isolate|edit|set-property|revert)"


def stub(path, body):
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


class InstallerTest(unittest.TestCase):

    def run_installer(self, missing):
        """Runs the installer as if root on a machine where `missing` (a set of
        package names, or "all") are not installed; returns the calls made."""
        d = tempfile.mkdtemp(prefix="lh-installer-")
        self.addCleanup(subprocess.run, ["rm", "-rf", d])
        bin_dir = os.path.join(d, "bin")
        os.makedirs(bin_dir)
        log = os.path.join(d, "calls")
        record = f'echo "$(basename "$0") $*" >>{log}\n'
        missing_words = " ".join(sorted(missing)) if missing != "all" else "*"
        stub(os.path.join(bin_dir, "dpkg-query"), record + f"""
pkg=$(for a in "$@"; do :; done; echo "$a")
case " {missing_words} " in
  *" * "*|*" $pkg "*) exit 1 ;;
esac
echo "install ok installed"
""")
        stub(os.path.join(bin_dir, "id"), 'if [ "$1" = -u ]; then echo 0; else exec /usr/bin/id "$@"; fi\n')
        for tool in ("apt-get", "apt", "dpkg", *SERVICE_TOOLS):
            stub(os.path.join(bin_dir, tool), record)
        env = dict(os.environ, PATH=bin_dir + ":" + os.environ.get("PATH", "/usr/bin:/bin"))
        proc = subprocess.run(["bash", INSTALLER], env=env, capture_output=True, text=True,
                              timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(log) as f:
            return [line.split() for line in f.read().splitlines()], proc.stderr

    def installed(self, calls):
        return [w for c in calls if c[0] == "apt-get" and "install" in c
                for w in c[c.index("install") + 1:] if not w.startswith("-")]

    def test_installing_missing_packages_leaves_every_service_alone(self):
        calls, _ = self.run_installer({"curl", "rsync"})
        tools = sorted({c[0] for c in calls if c[0] in SERVICE_TOOLS})
        self.assertEqual(tools, [], f"the installer ran {tools}: {calls}")
        self.assertEqual(sorted(self.installed(calls)), ["curl", "rsync"])
        for c in calls:
            if c[0] == "apt-get":
                self.assertIn(next(w for w in c[1:] if not w.startswith("-")), ("update", "install"), c)

    def test_a_bare_machine_gets_no_ssh_server(self):
        calls, _ = self.run_installer("all")
        self.assertEqual(sorted({c[0] for c in calls if c[0] in SERVICE_TOOLS}), [])
        packages = self.installed(calls)
        self.assertIn("openssl", packages)
        for server in ("openssh-server", "ssh", "dropbear", "tinysshd"):
            self.assertNotIn(server, packages)

    def test_nothing_missing_runs_nothing(self):
        calls, _ = self.run_installer(set())
        self.assertEqual([c for c in calls if c[0] != "dpkg-query"], [])

    def test_installer_and_bench_harness_have_no_service_commands(self):
        # A static guard for paths the runs above cannot reach.
        pattern = re.compile(r"\b(" + "|".join(re.escape(t) for t in SERVICE_TOOLS) + r")\b[^\n#]*\b"
                             + SERVICE_VERBS + r"\b")
        files = [INSTALLER] + [os.path.join(dp, f) for dp, _, fs in os.walk(BENCH) for f in fs
                               if f.endswith((".sh", ".py"))]
        for path in files:
            with open(path) as f:
                for n, line in enumerate(f, 1):
                    code = line.split("#", 1)[0]
                    self.assertIsNone(pattern.search(code), f"{path}:{n}: {line.strip()}")


if __name__ == "__main__":
    unittest.main()
