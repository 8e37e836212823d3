#!/usr/bin/python3
"""Runs clang's analysis, without code generation, on every translation unit
of a configured clang build that the build has not compiled itself.

  clang-syntax-check.py BUILD_DIR

deploy/check.sh clang builds only the targets its ThreadSanitizer suites need,
each compiled with -Wthread-safety -Werror. The thread-safety analysis and the
other warnings live in clang's front end, so every other translation unit
(the other tests, the CLI, the emulator, the fuzz replays) gets the same
checks from `-fsyntax-only`, in a fraction of a compile's time. Run it after
the build: it generates the sources it still lacks (the protos of targets
outside the built ones) with ninja first. Exits 1, with clang's messages,
when any unit has a warning or an error.
"""

import concurrent.futures
import json
import os
import shlex
import subprocess
import sys


def syntax_only(entry):
    """The entry's command with its output replaced by -fsyntax-only, and
    without sanitizer flags: they change code generation, not the analysis,
    and a target's own (the fuzz replays' ASan) may not mix with the build's
    TSan."""
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-MD", "-MMD") or a.startswith(("-fsanitize", "-fno-sanitize")):
            continue
        out.append(a)
    return out + ["-fsyntax-only"]


def main():
    build = os.path.abspath(sys.argv[1])
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    todo = []
    for e in entries:
        output = e.get("output")
        if output is None:
            args = shlex.split(e["command"]) if "command" in e else e["arguments"]
            output = args[args.index("-o") + 1]
        if not os.path.exists(os.path.join(e["directory"], output)):
            todo.append(e)

    # Generated sources of targets not built (and the headers generated
    # with them): ninja builds files named as targets.
    missing = [os.path.relpath(e["file"], build) for e in todo
               if os.path.abspath(e["file"]).startswith(build + os.sep)
               and not os.path.exists(e["file"])]
    if missing:
        subprocess.run(["ninja", "-C", build, *missing], check=True, stdout=subprocess.DEVNULL)

    def run(e):
        p = subprocess.run(syntax_only(e), cwd=e["directory"], capture_output=True, text=True)
        return e["file"], p.returncode, p.stderr

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        for file, code, err in pool.map(run, todo):
            if code != 0 or err.strip():
                failed += 1
                print(f"{file}:\n{err}", file=sys.stderr)
    print(f"clang-syntax-check: {len(todo)} units not built by the TSan targets checked, "
          f"{failed} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
