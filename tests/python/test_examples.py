"""The examples as a user runs them: executable scripts whose docstring names
the environment they read, and checkpoint_replicate.py with LONGHAUL_SITE_*
exported (by `eval "$(deploy/local-sites.sh up DIR)"` or for other daemons)."""

import ast
import os
import re
import subprocess
import unittest

from harness import LocalSites

EXAMPLES = os.path.join(os.environ.get("LONGHAUL_SOURCE_DIR", os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))))), "examples")
SCRIPTS = ["checkpoint_replicate.py", "diloco_sites.py", "diloco_two_sites.py"]

try:
    import torch  # noqa: F401 - python3-torch, which the examples need
except ImportError:
    torch = None


def run_example(name, env, *args):
    return subprocess.run([os.path.join(EXAMPLES, name), *args], env=env, capture_output=True,
                          text=True, timeout=600)


class ExamplesTest(unittest.TestCase):

    def test_examples_are_executable_and_document_their_environment(self):
        for name in SCRIPTS:
            path = os.path.join(EXAMPLES, name)
            self.assertTrue(os.access(path, os.X_OK), f"{name} is not executable")
            with open(path) as f:
                text = f.read()
            self.assertEqual(text.splitlines()[0], "#!/usr/bin/python3", name)
            doc = ast.get_docstring(ast.parse(text)) or ""
            self.assertIn("Environment", doc, name)
            # Every variable the script or local_sites.py reads for it.
            for var in ("PYTHONPATH", "LONGHAUL_BIN", "LONGHAUL_SOURCE_DIR"):
                self.assertIn(var, doc, f"{name}'s docstring does not name {var}")
            for var in set(re.findall(r"LONGHAUL_[A-Z_]+", text)) - {"LONGHAUL_SITE_"}:
                self.assertIn(var, doc, f"{name} reads {var}; its docstring does not name it")

    @unittest.skipIf(torch is None, "needs python3-torch")
    def test_checkpoint_replicate_with_exported_local_sites(self):
        with LocalSites(use_environment=False) as sites:
            env = dict(os.environ, LONGHAUL_SITE_A=sites.address("site-a"),
                       LONGHAUL_SITE_B=sites.address("site-b"))
            proc = run_example("checkpoint_replicate.py", env, "--shards", "2", "--hidden", "32")
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertIn("all equal", proc.stdout)

    @unittest.skipIf(torch is None, "needs python3-torch")
    def test_checkpoint_replicate_with_other_daemons_names_what_to_pass(self):
        env = dict(os.environ, LONGHAUL_SITE_A="unix:/run/lh-nowhere/a.sock",
                   LONGHAUL_SITE_B="unix:/run/lh-nowhere/b.sock")
        proc = run_example("checkpoint_replicate.py", env, "--shards", "2", "--hidden", "32")
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("--source-dir", proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)


if __name__ == "__main__":
    unittest.main()
