#!/usr/bin/python3
"""deploy/check-layers.py fails, naming the file and the include, on an
upward include planted in a copy of the tree, and naming the file, on a .cc
grown past the size limit; it passes on the tree as is.
With LONGHAUL_BUILD_DIR set, also: it fails, naming the library and the
symbol, on an upward call planted in a copy of the layers' archives."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "deploy", "check-layers.py")


BUILD = os.environ.get("LONGHAUL_BUILD_DIR")


def run(root, *extra):
    return subprocess.run([sys.executable, SCRIPT, "--root", root, *extra], capture_output=True,
                          text=True)


class CheckLayersTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="check_layers_test.")
        for top in ("common", "congestion", "storage", "client", "daemon", "proto"):
            shutil.copytree(os.path.join(ROOT, top), os.path.join(self.tmp, top))

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def plant(self, path, line):
        with open(os.path.join(self.tmp, path), "a") as f:
            f.write(line + "\n")

    def test_the_tree_passes(self):
        result = run(self.tmp)
        self.assertEqual(result.returncode, 0, result.stderr)

    def test_transport_including_the_peer_layer_fails(self):
        self.plant("daemon/transport/udp_transport.cc", '#include "daemon/peer/messaging.h"')
        result = run(self.tmp)
        self.assertEqual(result.returncode, 1)
        self.assertIn('daemon/transport/udp_transport.cc', result.stderr)
        self.assertIn('#include "daemon/peer/messaging.h": layer transport may not use layer peer',
                      result.stderr)

    def test_a_session_including_the_daemon_config_fails(self):
        # Sessions take option structs cut from the config by the source side.
        self.plant("daemon/peer/sender.h", '#include "daemon/config.h"')
        result = run(self.tmp)
        self.assertEqual(result.returncode, 1)
        self.assertIn('daemon/peer/sender.h', result.stderr)
        self.assertIn('layer peer may not use layer config', result.stderr)

    def test_a_session_including_the_daemon_wiring_fails(self):
        self.plant("daemon/peer/sender.h", '#include "daemon/daemon.h"')
        result = run(self.tmp)
        self.assertEqual(result.returncode, 1)
        self.assertIn('layer peer may not use layer daemon', result.stderr)

    def test_storage_including_the_wire_fails(self):
        self.plant("storage/journal.cc", '#include "daemon/wire/frames.h"')
        result = run(self.tmp)
        self.assertEqual(result.returncode, 1)
        self.assertIn('storage/journal.cc', result.stderr)
        self.assertIn('layer storage may not use layer wire', result.stderr)

    def test_the_wire_including_storage_fails(self):
        # Frames know nothing of files.
        self.plant("daemon/wire/messaging.cc", '#include "storage/chunk_io.h"')
        result = run(self.tmp)
        self.assertEqual(result.returncode, 1)
        self.assertIn('daemon/wire/messaging.cc', result.stderr)
        self.assertIn('#include "storage/chunk_io.h": layer wire may not use layer storage',
                      result.stderr)

    def test_the_source_side_including_the_daemon_wiring_fails(self):
        self.plant("daemon/transfer/transfer_manager.cc", '#include "daemon/control_service.h"')
        result = run(self.tmp)
        self.assertEqual(result.returncode, 1)
        self.assertIn('daemon/transfer/transfer_manager.cc', result.stderr)
        self.assertIn('layer transfer may not use layer daemon', result.stderr)

    def test_a_session_including_the_source_side_fails(self):
        self.plant("daemon/peer/receiver.cc", '#include "daemon/transfer/relay.h"')
        result = run(self.tmp)
        self.assertEqual(result.returncode, 1)
        self.assertIn('daemon/peer/receiver.cc', result.stderr)
        self.assertIn('layer peer may not use layer transfer', result.stderr)

    def test_the_source_side_including_the_exchange_fails(self):
        self.plant("daemon/transfer/relay.cc", '#include "daemon/exchange/exchange_hub.h"')
        result = run(self.tmp)
        self.assertEqual(result.returncode, 1)
        self.assertIn('layer transfer may not use layer exchange', result.stderr)

    def test_a_cc_over_the_size_limit_fails(self):
        path = "storage/journal.cc"
        with open(os.path.join(self.tmp, path)) as f:
            lines = sum(1 for _ in f)
        for _ in range(901 - lines):
            self.plant(path, "// padding")
        result = run(self.tmp)
        self.assertEqual(result.returncode, 1)
        self.assertIn("storage/journal.cc: 901 lines, over the limit of 900", result.stderr)

    def test_a_cc_at_the_size_limit_passes(self):
        path = "client/cli/main.cc"
        with open(os.path.join(self.tmp, path)) as f:
            lines = sum(1 for _ in f)
        for _ in range(900 - lines):
            self.plant(path, "// padding")
        result = run(self.tmp)
        self.assertEqual(result.returncode, 0, result.stderr)

    def test_congestion_including_protobuf_or_spdlog_fails(self):
        self.plant("congestion/bbr3.cc", '#include "spdlog/spdlog.h"')
        self.plant("congestion/pacer.cc", '#include "longhaul/v1/peer.pb.h"')
        result = run(self.tmp)
        self.assertEqual(result.returncode, 1)
        self.assertIn('congestion/bbr3.cc', result.stderr)
        self.assertIn('congestion/pacer.cc', result.stderr)
        self.assertIn('layer congestion may not use layer proto', result.stderr)


@unittest.skipUnless(BUILD, "LONGHAUL_BUILD_DIR names no build to take the archives from")
class CheckLayerSymbolsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="check_layers_symbols_test.")
        for directory, _, files in os.walk(BUILD):
            for f in files:
                if f.startswith("liblonghaul_") and f.endswith(".a"):
                    relative = os.path.relpath(os.path.join(directory, f), BUILD)
                    os.makedirs(os.path.dirname(os.path.join(self.tmp, relative)), exist_ok=True)
                    shutil.copy(os.path.join(BUILD, relative), os.path.join(self.tmp, relative))

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_the_archives_pass(self):
        result = run(ROOT, "--archives", self.tmp)
        self.assertEqual(result.returncode, 0, result.stderr)

    def test_a_transport_calling_into_the_peer_layer_fails(self):
        # Links into longhauld (which has the peer layer too), yet is upward.
        source = os.path.join(self.tmp, "planted.cc")
        with open(source, "w") as f:
            f.write("#include <new>\n"
                    "namespace longhaul::peer {\n"
                    "class PeerMemoryBudget { public: explicit PeerMemoryBudget(unsigned long); };\n"
                    "}\n"
                    "void PlantedUpwardCall(void* p) { new (p) longhaul::peer::PeerMemoryBudget(1); }\n")
        subprocess.run(["c++", "-c", source, "-o", source + ".o"], check=True)
        subprocess.run(["ar", "r", os.path.join(self.tmp, "daemon/liblonghaul_transport.a"),
                        source + ".o"], check=True, capture_output=True)
        result = run(ROOT, "--archives", self.tmp)
        self.assertEqual(result.returncode, 1)
        self.assertIn("daemon/liblonghaul_transport.a: needs "
                      "longhaul::peer::PeerMemoryBudget::PeerMemoryBudget(unsigned long), "
                      "defined in layer peer, which is not below transport", result.stderr)


if __name__ == "__main__":
    unittest.main()
