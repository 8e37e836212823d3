"""The two binaries as a shell sees them: --version, the exit code of a usage
error, and the first error about a bad configuration."""

import os
import re
import subprocess
import tempfile
import unittest

import lh


def project_version():
    with open(os.path.join(lh.ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(longhaul VERSION ([0-9.]+)", f.read()).group(1)


def run(binary, *args):
    return subprocess.run([os.path.join(lh.BIN, binary), *args], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=60)


class BinaryFlagsTest(unittest.TestCase):

    def test_version_names_the_project_version(self):
        for binary in ("longhauld", "longhaul"):
            proc = run(binary, "--version")
            self.assertEqual(proc.returncode, 0, f"{binary}: {proc.stderr}")
            self.assertTrue(proc.stdout.startswith(project_version()),
                            f"{binary} --version printed {proc.stdout!r}")

    def test_usage_errors_exit_2(self):
        cases = [("longhauld",), ("longhauld", "--no-such-flag"), ("longhauld", "--config"),
                 ("longhaul",), ("longhaul", "--no-such-flag", "ls"), ("longhaul", "status")]
        for binary, *args in cases:
            proc = run(binary, *args)
            self.assertEqual(proc.returncode, 2, f"{binary} {args}: {proc.stderr}")
            self.assertNotEqual(proc.stderr, "", f"{binary} {args} said nothing")

    def test_help_exits_0(self):
        for binary in ("longhauld", "longhaul"):
            proc = run(binary, "--help")
            self.assertEqual(proc.returncode, 0, f"{binary}: {proc.stderr}")
            self.assertIn("--version", proc.stdout)

    def test_a_bad_configuration_names_the_documentation(self):
        with tempfile.TemporaryDirectory(prefix="lh-bin-") as tmp:
            config = os.path.join(tmp, "longhauld.yaml")
            with open(config, "w") as f:
                f.write("site: site-a\nno_such_key: 1\n")
            proc = run("longhauld", "--config", config)
            self.assertEqual(proc.returncode, 1, proc.stderr)
            output = proc.stdout + proc.stderr
            self.assertIn(config, output)
            self.assertIn("no_such_key", output)
            self.assertIn("man longhauld", output)
            self.assertIn("/usr/share/doc/longhaul/CONFIG.md", output)

    def test_a_start_failure_names_the_documentation_and_longhaul_pki(self):
        with tempfile.TemporaryDirectory(prefix="lh-bin-") as tmp:
            config = os.path.join(tmp, "longhauld.yaml")
            with open(config, "w") as f:
                f.write(f"site: site-a\nlisten: 127.0.0.1:0\nstate_dir: {tmp}/state\n"
                        f"tls: {{ca: {tmp}/tls/ca.pem, cert: {tmp}/tls/site-a.pem, "
                        f"key: {tmp}/tls/site-a.key}}\nmetrics: {{listen: \"\"}}\n")
            proc = run("longhauld", "--config", config)
            self.assertEqual(proc.returncode, 1, proc.stderr)
            output = proc.stdout + proc.stderr
            self.assertIn(f"{tmp}/tls/ca.pem", output)
            self.assertIn("man longhauld", output)
            self.assertIn("longhaul-pki", output)


if __name__ == "__main__":
    unittest.main()
