"""Disk under abuse (ctest label `security`): a hostile peer with a valid
certificate (hostile_peer.py) declares far more than it sends, abandons
transfers and leaves abort tombstones. Staging must use disk only for the
bytes received, and with peer_limits.incoming_expiry an abandoned transfer
must become EXPIRED (staging gone, shown by `ls --all`) and a tombstone must
age out, while the daemon stays up and a real transfer completes and
verifies. A real sender that comes back after its transfer expired fails
with an error saying so, and never publishes a mix."""

import json
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import lh  # noqa: E402

import hostile_peer  # noqa: E402
from hostile_peer import MIN_CHUNK_SIZE, ROLE_DATA, ACK_DURABLE  # noqa: E402

MIB = 1 << 20
EXPIRY_S = 3
# What one 64 KiB chunk of a huge declared file may cost on disk, staging
# directory and file metadata included.
MAX_STAGING_BYTES = 16 * MIB
# The daemon's resident set may not grow with what a peer declares.
MAX_RSS_BYTES = 256 * MIB


def disk_usage(root):
    """Bytes allocated (st_blocks) under `root`, as du counts them."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total + os.lstat(root).st_blocks * 512



class DiskAbuseTest(lh.SitesTestCase):
    extra_config = f"peer_limits:\n  incoming_expiry: {EXPIRY_S}s\n"

    # -- helpers ----------------------------------------------------------

    def hostile(self):
        with open(self.sites.path("site-b", "longhauld.yaml")) as f:
            listen = [l for l in f if l.startswith("listen:")][0].split()[1]
        return hostile_peer.HostilePeer(self.sites.path("pki"), "site-a", listen, "site-b")

    def staging(self, transfer_id):
        return os.path.join(self.sites.export("site-b"), ".longhaul", "staging", transfer_id)

    def open_one_file(self, peer, transfer_id, size, dest):
        control = peer.control(transfer_id)
        self.addCleanup(control.close)
        m = hostile_peer.manifest([hostile_peer.manifest_file("big.bin", size)])
        opened = control.open(transfer_id, "ckpt", dest, m)
        self.assertTrue(opened.ok(), opened)
        return control, m

    def send_first_chunk(self, peer, transfer_id):
        data = peer.connect(ROLE_DATA, transfer_id)
        self.addCleanup(data.close)
        result, why = data.send_chunk(0, 0, os.urandom(MIN_CHUNK_SIZE))
        self.assertEqual(result, ACK_DURABLE, why)
        return data

    def start_real_transfer(self, name):
        src = self.sites.path("src-" + name)
        os.makedirs(src)
        for i in range(4):
            lh.write_random(os.path.join(src, f"shard-{i}.bin"), 4 * MIB, seed=i)
        proc = self.sites.cli("a", "cp", src, f"site-b:/ckpt/{name}", "--chunk-size", "1MiB",
                              check=True)
        return src, proc.stdout.strip().split()[-1]

    def assert_real_transfer_verifies(self, src, transfer_id):
        done = self.sites.wait_state("a", transfer_id, {"COMPLETED", "FAILED", "CANCELLED"})
        self.assertEqual(done["state"], "COMPLETED", done)
        verify = self.sites.cli("a", "verify", transfer_id, "--json")
        self.assertEqual(verify.returncode, 0, verify.stdout + verify.stderr)
        dest = os.path.join(self.sites.export("site-b"), os.path.basename(src)[len("src-"):])
        self.assertEqual(lh.tree_digest(src), lh.tree_digest(dest))

    def assert_alive_and_bounded(self):
        pid = self.sites.pid("site-b")
        os.kill(pid, 0)
        self.assertLess(lh.proc_status(pid, "VmHWM") * 1024, MAX_RSS_BYTES)

    def listed(self, transfer_id):
        proc = self.sites.cli("b", "ls", "--all", "--json", check=True)
        for t in json.loads(proc.stdout)["transfers"]:
            if t["id"] == transfer_id:
                return t
        return None

    # -- cases ------------------------------------------------------------

    def test_one_chunk_of_an_8_gib_file_uses_kilobytes_of_disk(self):
        peer = self.hostile()
        self.open_one_file(peer, "t-huge", 8 << 30, "huge.bin")
        # The data channel stays open: the transfer is active, not abandoned.
        self.send_first_chunk(peer, "t-huge")
        src, real = self.start_real_transfer("alongside")

        staged = os.path.join(self.staging("t-huge"), "f", "0")
        self.assertEqual(os.stat(staged).st_size, 8 << 30)  # sized, sparse
        used = disk_usage(self.staging("t-huge"))
        self.assertLess(used, MAX_STAGING_BYTES, f"staging of one chunk uses {used} bytes")

        self.assert_real_transfer_verifies(src, real)
        self.assert_alive_and_bounded()

    def test_an_abandoned_transfer_expires_and_a_tombstone_ages_out(self):
        peer = self.hostile()
        control, m = self.open_one_file(peer, "t-gone", 4 * MIB, "gone")
        self.send_first_chunk(peer, "t-gone").close()
        control.close()
        self.assertTrue(os.path.isdir(self.staging("t-gone")))

        # A tombstone: an abort before any open refuses a later open.
        tomb = peer.control("t-tomb")
        self.addCleanup(tomb.close)
        self.assertTrue(tomb.abort("t-tomb").ok())
        refused = tomb.open("t-tomb", "ckpt", "tomb", m)
        self.assertIn("was cancelled", refused.error)
        src, real = self.start_real_transfer("meanwhile")

        lh.wait_until(lambda: (self.listed("t-gone") or {}).get("state") == "EXPIRED",
                      10 * EXPIRY_S, "t-gone EXPIRED in ls --all", interval=0.2)
        self.assertFalse(os.path.exists(self.staging("t-gone")))

        # Its sender coming back never resumes into a mixed staging: it is
        # told, or (once the EXPIRED record aged out too) starts over.
        back = peer.control("t-gone")
        self.addCleanup(back.close)
        reopened = back.open("t-gone", "ckpt", "gone", m)
        if reopened.ok():
            self.assertEqual(reopened.body.get(1, []), [], "nothing may be durable any more")
            self.assertTrue(back.abort("t-gone").ok())
        else:
            self.assertIn("expired", reopened.error)
            self.assertFalse(os.path.exists(self.staging("t-gone")))

        # The tombstone goes after the same time: the open is accepted again.
        lh.wait_until(lambda: tomb.open("t-tomb", "ckpt", "tomb", m).ok(), 10 * EXPIRY_S,
                      "the t-tomb tombstone to age out", interval=0.5)
        self.assertTrue(tomb.abort("t-tomb").ok())

        self.assert_real_transfer_verifies(src, real)
        self.assert_alive_and_bounded()

    def test_a_sender_back_after_expiry_fails_clearly_and_a_new_copy_completes(self):
        src = self.sites.path("src-late")
        os.makedirs(src)
        lh.write_random(os.path.join(src, "shard.bin"), 32 * MIB, seed=9)
        self.sites.cli("a", "limit", "--peer", "site-b", "40Mbit", check=True)
        tid = self.sites.cli("a", "cp", src, "site-b:/ckpt/late", "--chunk-size", "1MiB",
                             check=True).stdout.strip()
        lh.wait_until(lambda: self.sites.status("a", tid)["bytes_done"] > 0, 60,
                      "first durable chunk", interval=0.1)
        self.sites.cli("a", "pause", tid, check=True)
        lh.wait_until(lambda: (self.listed(tid) or {}).get("state") == "EXPIRED",
                      10 * EXPIRY_S, f"{tid} EXPIRED at site-b", interval=0.2)
        self.assertFalse(os.path.exists(self.staging(tid)))

        self.sites.cli("a", "limit", "--peer", "site-b", "off", check=True)
        self.sites.cli("a", "resume", tid, check=True)
        done = self.sites.wait_state("a", tid, {"COMPLETED", "FAILED"})
        dest = os.path.join(self.sites.export("site-b"), "late")
        if done["state"] == "FAILED":
            self.assertIn("expired", done["error"])
            self.assertFalse(os.path.exists(dest))
        else:  # the EXPIRED record aged out first: it started over, whole
            self.assertEqual(lh.tree_digest(src), lh.tree_digest(dest))

        again = self.sites.cli("a", "cp", src, "site-b:/ckpt/late", "--chunk-size", "1MiB",
                               check=True).stdout.strip()
        self.assert_real_transfer_verifies(src, again)
        self.assert_alive_and_bounded()


if __name__ == "__main__":
    unittest.main()
