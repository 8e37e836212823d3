#!/usr/bin/python3
"""Checks longhaul's layering rules, by include and by symbol, and its size rule.

Every source file belongs to one layer (LAYERS, first match wins). A layer
may include only its own headers and those of the layers it lists as below
it; the proto layer (generated headers and proto/longhaul/) and third-party
headers are allowed everywhere except where a layer narrows them
(congestion/: absl and the standard library only).

  check-layers.py [--root DIR]           the #include lines under DIR
  check-layers.py --archives BUILD_DIR   also: every longhaul symbol a layer's
                                         static library leaves undefined is
                                         defined in that library or below it

Size rule: no .cc file under daemon/, storage/, client/ or congestion/ has
more than MAX_LINES lines. A file that grows past it is split by
responsibility (a class's session in one file, its source reading in another),
never by line count alone.

A static library can leave an upward call undefined and still link into an
executable that links the upper layer too, so the link itself proves
nothing; the symbol check does. Exits 1 naming each offending file and
include (or library and symbol), 0 when the rules hold.
"""

import argparse
import fnmatch
import os
import re
import subprocess
import sys

# (layer, file globs, layers below it that it may use). Ordered bottom-up;
# a file belongs to the first layer whose globs match it.
LAYERS = [
    ("common", ["common/*"], []),
    ("congestion", ["congestion/*"], ["common"]),
    ("storage", ["storage/*"], ["common"]),
    ("client", ["client/*"], ["common"]),
    ("metrics", ["daemon/metrics/exposition.*", "daemon/metrics/http_server.*"], ["common"]),
    # Frames know nothing of files: no storage below the wire.
    ("wire", ["daemon/wire/*"], ["common"]),
    ("unix_listener", ["daemon/unix_listener.*"], ["common"]),
    ("config", ["daemon/config.*"], ["common"]),
    ("transport", ["daemon/transport/*"], ["common", "congestion", "wire"]),
    ("qos", ["daemon/peer/priority_gate.*", "daemon/peer/rate_limiter.*"],
     ["common", "congestion", "wire", "transport"]),
    ("peer", ["daemon/peer/*"], ["common", "congestion", "storage", "wire", "transport", "qos"]),
    ("exchange", ["daemon/exchange/*"],
     ["common", "congestion", "storage", "wire", "transport", "qos", "peer", "unix_listener"]),
    # The source side: everything that runs a transfer from this site.
    ("transfer", ["daemon/transfer/*"],
     ["common", "congestion", "storage", "config", "wire", "transport", "qos", "peer"]),
    # The wiring: the daemon object, its control planes and metrics.
    ("daemon", ["daemon/*"],
     ["common", "congestion", "storage", "metrics", "wire", "unix_listener", "config", "transport",
      "qos", "peer", "exchange", "transfer"]),
]

# The static library of each layer, relative to the build directory.
ARCHIVES = {
    "common": "common/liblonghaul_common.a",
    "congestion": "congestion/liblonghaul_congestion.a",
    "storage": "storage/liblonghaul_storage.a",
    "metrics": "daemon/metrics/liblonghaul_metrics.a",
    "wire": "daemon/liblonghaul_wire.a",
    "unix_listener": "daemon/liblonghaul_unix_listener.a",
    "config": "daemon/liblonghaul_config.a",
    "transport": "daemon/liblonghaul_transport.a",
    "qos": "daemon/liblonghaul_qos.a",
    "peer": "daemon/liblonghaul_peer.a",
    "exchange": "daemon/liblonghaul_exchange.a",
    "transfer": "daemon/liblonghaul_transfer.a",
    "daemon": "daemon/liblonghaul_daemon.a",
}

# Third-party headers a layer may include; None: any.
THIRD_PARTY = {"congestion": ["absl/"]}

# The size rule: the folders it covers and the most lines a .cc may have.
SIZE_CHECKED_DIRS = ("daemon", "storage", "client", "congestion")
MAX_LINES = 900

PROJECT_DIRS = ("common/", "congestion/", "storage/", "daemon/", "client/", "proto/", "tests/")
SOURCE_SUFFIXES = (".h", ".cc")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


def layer_of(path):
    for name, globs, _ in LAYERS:
        if any(fnmatch.fnmatch(path, g) for g in globs):
            return name
    return None


def include_target(root, include):
    """The layer an include names, "proto", "third-party" or "tests"."""
    if include.startswith("longhaul/v1/") or os.path.exists(os.path.join(root, "proto", include)):
        return "proto"
    if os.path.exists(os.path.join(root, "client", "include", include)):
        return "client"
    if include.startswith("tests/"):
        return "tests"
    if include.startswith(PROJECT_DIRS):
        return layer_of(include) or "unknown"
    return "third-party"


def check_includes(root):
    problems = []
    below = {name: set(lower) for name, _, lower in LAYERS}
    for top in ("common", "congestion", "storage", "client", "daemon"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.relpath(os.path.join(dirpath, f), root)
                layer = layer_of(path)
                if layer is None:
                    continue
                with open(os.path.join(root, path), encoding="utf-8", errors="replace") as src:
                    for number, line in enumerate(src, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        bracket, include = m.groups()
                        target = include_target(root, include)
                        if target == "third-party":
                            allowed = THIRD_PARTY.get(layer)
                            if (allowed is not None and bracket == '"'
                                    and not include.startswith(tuple(allowed))):
                                problems.append(
                                    f"{path}:{number}: #include \"{include}\": layer {layer} "
                                    f"may include only {', '.join(allowed)} of third-party code")
                            continue
                        if target == "proto" and layer != "congestion":
                            continue
                        if target == layer or target in below[layer]:
                            continue
                        problems.append(
                            f"{path}:{number}: #include {bracket}{include}"
                            f"{'>' if bracket == '<' else bracket}: layer {layer} may not use "
                            f"layer {target} (it may use: {', '.join(sorted(below[layer])) or 'none'})")
    return problems


def check_sizes(root):
    problems = []
    for top in SIZE_CHECKED_DIRS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith(".cc"):
                    continue
                path = os.path.join(dirpath, f)
                with open(path, encoding="utf-8", errors="replace") as src:
                    lines = sum(1 for _ in src)
                if lines > MAX_LINES:
                    problems.append(
                        f"{os.path.relpath(path, root)}: {lines} lines, over the limit of "
                        f"{MAX_LINES}; split it by responsibility")
    return problems


def symbols(archive, *flags):
    out = subprocess.run(["nm", "-g", "--format=posix", *flags, archive], check=True,
                         capture_output=True, text=True).stdout
    result = set()
    for line in out.splitlines():
        parts = line.split()
        # "name type [value size]"; archive member headers end with ':'.
        if len(parts) >= 2 and not parts[0].endswith(":") and "8longhaul" in parts[0]:
            result.add(parts[0])
    return result


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), check=True, capture_output=True,
                         text=True).stdout
    return out.splitlines()


def check_archives(build):
    defined, undefined = {}, {}
    for layer, relative in ARCHIVES.items():
        archive = os.path.join(build, relative)
        if not os.path.exists(archive):
            return [f"{archive}: missing (build the layer targets first)"]
        defined[layer] = symbols(archive, "--defined-only")
        undefined[layer] = symbols(archive, "--undefined-only") - defined[layer]
    below = {name: set(lower) for name, _, lower in LAYERS}
    problems = []
    for layer in ARCHIVES:
        upward = []
        for symbol in sorted(undefined[layer]):
            owners = [o for o in ARCHIVES if symbol in defined[o]]
            if owners and not any(o in below[layer] for o in owners):
                upward.append((symbol, owners))
        for (symbol, owners), readable in zip(upward, demangle([s for s, _ in upward])):
            problems.append(f"{ARCHIVES[layer]}: needs {readable}, defined in layer "
                            f"{', '.join(owners)}, which is not below {layer}")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--archives", metavar="BUILD_DIR")
    args = parser.parse_args()
    problems = check_includes(args.root) + check_sizes(args.root)
    if args.archives:
        problems += check_archives(args.archives)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"check-layers: {len(problems)} problems", file=sys.stderr)
        return 1
    print(f"check-layers: every layer uses only the layers below it, "
          f"and no .cc has more than {MAX_LINES} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
