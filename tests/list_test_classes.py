#!/usr/bin/python3
"""Prints, one a line, the TestCase classes of a unittest module that
`python3 -m unittest MODULE` would run: the classes defined at the top of
MODULE.py with at least one test_ method, their own or inherited from a class
of the same module. Reads the file's syntax only and imports nothing, so it
runs at configure time, before anything is built.

  list_test_classes.py FILE.py               the classes, one a line
  list_test_classes.py --check FILE.py...    exit 1 unless, for each file, the
                                             list is the one unittest's own
                                             loader finds by importing it
"""

import ast
import os
import subprocess
import sys


def test_classes(path):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}

    def has_tests(name, seen=()):
        node = classes.get(name)
        if node is None or name in seen:
            return False  # a class of another module: none of ours has tests there
        if any(isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
               and item.name.startswith("test") for item in node.body):
            return True
        return any(isinstance(base, ast.Name) and has_tests(base.id, (*seen, name))
                   for base in node.bases)

    return [name for name in classes if has_tests(name)]


def loaded_classes(path):
    """The classes of the tests unittest's loader finds in `path`: imported
    in a fresh interpreter in its own folder, as `python3 -m unittest` does."""
    directory, module = os.path.split(os.path.abspath(path))
    code = ("import sys, unittest\n"
            "def tests(s):\n"
            "    for t in s:\n"
            "        yield from tests(t) if isinstance(t, unittest.TestSuite) else (t,)\n"
            f"suite = unittest.defaultTestLoader.loadTestsFromName({module[:-3]!r})\n"
            "print('\\n'.join(sorted({type(t).__name__ for t in tests(suite)})))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=directory, check=True,
                         capture_output=True, text=True).stdout
    return set(out.split())


def check(paths):
    failed = False
    for path in paths:
        listed, loaded = set(test_classes(path)), loaded_classes(path)
        if listed != loaded:
            failed = True
            print(f"{path}: listed {sorted(listed)}, but unittest loads {sorted(loaded)}",
                  file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1] == "--check":
        sys.exit(check(sys.argv[2:]))
    names = test_classes(sys.argv[1])
    if not names:
        sys.exit(f"{sys.argv[1]}: no TestCase class with tests")
    print("\n".join(names))
