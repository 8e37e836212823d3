"""The authority-swap harness (ctest label `security`): every operation of
authority_catalogue.py is recorded as its legitimate principal does it, then
replayed under every other principal of its entry, against real daemons.

Five sites. site-b is the destination: its export `ckpt` lists site-a and
site-c in `writers` and site-d in `readers`; site-e is a configured peer it
lists nowhere. site-a (the owner) publishes `run/step-1`, leaves transfer
T in flight (one of two chunks durable), and opens TR naming site-c as its
relay; site-b pulls `pulled.bin` from site-d (paused at site-d, so its
grant holds); site-d has site-b copy `run/step-1` to site-e (a remote
request). Control calls are replayed by uid nobody on site-b's control
socket and by a viewer token on its TCP control address.

After each replay the harness asserts that the answer is a refusal that
leaks nothing (no host path; no transfer id, path, file or site the
principal did not send itself; no answer body), and that site-b's export
(paths, sizes, digests, modes, the staging area included) and its journal
as an operator and an owner can see it (`longhaul ls --all --json` of
site-b, the durable counters of its /metrics, and each in-flight
transfer's progress as its owner asks for it) are unchanged. An outcome the
catalogue marks `Allowed` has its effect asserted instead.

Seeded: LONGHAUL_SWAP_SEED (default 1207) picks the order of the replays,
the transfer ids, and a mutation of each recorded message (another
transfer's id, a `..` path, another export, another owner in a relay's
attach). A failure prints the seed and
the command that replays it; LONGHAUL_SWAP_VERBOSE=1 prints every replay.
"""

import hashlib
import json
import os
import random
import re
import shutil
import ssl
import stat
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import lh  # noqa: E402

import authority_catalogue as cat  # noqa: E402
import hostile_peer as hp  # noqa: E402

SEED = int(os.environ.get("LONGHAUL_SWAP_SEED", "1207"))
REPLAY = (f"cd tests/security && LONGHAUL_SWAP_SEED={SEED} LONGHAUL_BIN=<build>/bin "
          "/usr/bin/python3 -m unittest -v test_authority_swap")
# LONGHAUL_SWAP_VERBOSE=1 prints every replay and what it got.
VERBOSE = os.environ.get("LONGHAUL_SWAP_VERBOSE") == "1"
NOBODY = 65534
CHUNK = hp.MIN_CHUNK_SIZE
MARKER = "model.index.json"
OPERATOR_TOKEN = "op-" + "7c11e0" * 6
VIEWER_TOKEN = "view-" + "0b54fd" * 6

# PeerMessage body fields (peer.proto).
OPEN, OPEN_REPLY, COMMIT, COMMIT_REPLY, ABORT, ABORT_REPLY, VERIFY, VERIFY_REPLY = range(2, 10)
REMOTE_SUBMIT, REMOTE_GET, REMOTE_CANCEL, REMOTE_REPLY, RELAY_ATTACH, PROGRESS = range(10, 16)
PROGRESS_REPLY = 16
REQUEST_FIELDS = {"open": OPEN, "commit": COMMIT, "abort": ABORT, "verify": VERIFY,
                  "progress": PROGRESS, "relay_attach": RELAY_ATTACH,
                  "remote_submit": REMOTE_SUBMIT, "remote_get": REMOTE_GET,
                  "remote_cancel": REMOTE_CANCEL}
REPLY_FIELDS = {"open_reply": OPEN_REPLY, "commit_reply": COMMIT_REPLY,
                "abort_reply": ABORT_REPLY, "verify_reply": VERIFY_REPLY,
                "progress_reply": PROGRESS_REPLY, "remote_reply": REMOTE_REPLY}

# Which site plays each principal against site-b.
PEER_SITE = {cat.OWNER: "site-a", cat.NOT_WRITER: "site-e", cat.READER_ONLY: "site-d",
             cat.RELAY: "site-c", cat.PULLED_SOURCE: "site-d", cat.THIRD_SITE: "site-c"}


def encode(fields):
    """A protobuf message from decode()'s {field: [values]} (varints and
    length-delimited values only, which is all the bodies replayed here hold)."""
    return hp.message(*[(n, v) for n, values in sorted(fields.items()) for v in values])


def with_fields(body, **changes):
    """`body` with top-level fields replaced: f1=..., f15=... (None removes)."""
    fields = hp.decode(body)
    for key, value in changes.items():
        number = int(key[1:])
        if value is None:
            fields.pop(number, None)
        else:
            fields[number] = [value.encode() if isinstance(value, str) else value]
    return encode(fields)


class Outcome:
    """What a replay got back: `refused` (an error answer, a refused chunk
    ack, or the channel closed), the text a principal reads, and whether an
    answer body came with it."""

    def __init__(self, refused, text="", body_field=None, result=None):
        self.refused = refused
        self.text = text
        self.body_field = body_field
        self.result = result

    def __repr__(self):
        return f"Outcome(refused={self.refused}, text={self.text!r}, body={self.body_field})"


class SwapSites:
    """The five sites, the recorded interactions and the views the
    assertions compare."""

    def __init__(self, tokens_dir):
        extra = ("control_listen: 127.0.0.1:0\ncontrol_tokens:\n"
                 f"  operator: {os.path.join(tokens_dir, 'operator.token')}\n"
                 f"  viewer: {os.path.join(tokens_dir, 'viewer.token')}\n")
        self.sites = lh.AccessSites(("site-a", "site-b", "site-c", "site-d", "site-e"),
                                    writers="site-b=site-a,site-c", readers="site-b=site-d")
        self.sites.extra_config = extra
        self.rng = random.Random(SEED)
        self.recorded = {}  # catalogue name -> (field, body) as the legitimate principal sent it
        self.answers = {}   # reply name -> its body as site-b answered the legitimate principal
        self.tids = {}

    # -- plumbing --------------------------------------------------------

    def tid(self, name):
        """A transfer id for `name`, its suffix picked by the seed."""
        return f"{name}-{self.rng.randrange(1 << 32):08x}"

    def listen(self, site):
        with open(self.sites.path(site, "longhauld.yaml")) as f:
            return [line for line in f if line.startswith("listen:")][0].split()[1]

    def peer(self, site, target="site-b"):
        return hp.HostilePeer(self.sites.path("pki"), site, self.listen(target), target)

    def export(self, *parts):
        return os.path.join(self.sites.export("site-b"), *parts)

    @staticmethod
    def call(channel, field, body):
        """Channel.call that also returns the answer's raw body."""
        request_id = channel.next_request
        channel.next_request += 1
        channel.sock.sendall(hp._frame(hp.CONTROL, hp.message((1, request_id), (field, body)),
                                       channel.session))
        kind, payload = channel.read_frame()
        if kind != hp.CONTROL:
            raise ValueError(f"expected a control answer, got frame type {kind}")
        answer = hp.Answer(payload)
        raw = hp.decode(payload).get(answer.body_field, [b""])[0] if answer.body_field else b""
        return answer, raw

    def record(self, name, channel, field, body, reply=None):
        """Sends `body` as the legitimate principal; records it (and the
        answer, as `reply`); returns the Answer, which must be ok."""
        answer, raw = self.call(channel, field, body)
        if not answer.ok():
            raise AssertionError(f"the legitimate {name} was refused: {answer.error}")
        self.recorded[name] = (field, body)
        if reply:
            self.answers[reply] = raw
        return answer

    # -- setup -----------------------------------------------------------

    def up(self):
        self.sites.up()
        # nobody reaches site-b's control socket, as a member of its group would.
        for d in (self.sites.dir, self.sites.path("site-b")):
            os.chmod(d, 0o755)
        os.chmod(self.sites.path("site-b", "control.sock"), 0o666)
        ready = [l for l in self.sites.log("site-b").splitlines() if "control also on tcp" in l]
        self.tcp_address = ready[0].split("control also on tcp ")[1].split()[0]
        self.content = self.rng.randbytes(2 * CHUNK - 1000)
        self.manifest = hp.manifest([hp.manifest_file("x.bin", len(self.content))])
        self.publish_step_1()
        self.open_in_flight()
        self.open_relayed()
        self.record_open_variants()
        self.start_pull()
        self.remote_copy()
        return self

    def publish_step_1(self):
        """site-a's published run/step-1 (the target of replace, prune and
        verify), recording its open, chunk, commit and verify."""
        tid = self.tids["P"] = self.tid("t-owner-published")
        files = [("shard-0.pt", self.rng.randbytes(3000)), (MARKER, b'{"step": 1}')]
        owner = self.peer("site-a")
        control = owner.control(tid)
        try:
            m = hp.manifest([hp.manifest_file(p, len(d)) for p, d in files])
            self.record("open", control, OPEN, hp.open_request(tid, "ckpt", "run/step-1", m,
                                                              commit_last=[MARKER]), "open_reply")
            data = owner.connect(hp.ROLE_DATA, tid)
            for index, (_, content) in enumerate(files):
                result, why = data.send_chunk(index, 0, content)
                assert result == hp.ACK_DURABLE, why
            data.close()
            self.record("commit", control, COMMIT, hp.message((1, tid)), "commit_reply")
            self.record("verify", control, VERIFY, hp.message((1, tid)), "verify_reply")
        finally:
            control.close()

    def open_in_flight(self):
        """T: site-a's transfer to run/step-2, chunk 0 of 2 durable; records
        the chunk frame and a progress (without digests) of it."""
        tid = self.tids["T"] = self.tid("t-owner-in-flight")
        owner = self.peer("site-a")
        control = owner.control(tid)
        try:
            answer = control.open(tid, "ckpt", "run/step-2", self.manifest, single_file=True)
            assert answer.ok(), answer
            data = owner.connect(hp.ROLE_DATA, tid)
            piece = self.content[:CHUNK]
            low, high = hp.xxh128(piece)
            self.recorded["chunk"] = (None, hp.chunk_header(0, 0, 0, (low, high)) + piece)
            result, why = data.send_chunk(0, 0, piece)
            assert result == hp.ACK_DURABLE, why
            data.close()
            self.record("progress", control, PROGRESS, hp.message((1, tid)), "progress_reply")
        finally:
            control.close()
        # The legitimate abort, of a transfer of its own that it gives up.
        scratch = self.tid("t-owner-aborted")
        control = owner.control(scratch)
        try:
            assert control.open(scratch, "ckpt", "run/abandoned", self.manifest,
                                single_file=True).ok()
            self.record("abort", control, ABORT, hp.message((1, scratch), (2, "given up")),
                        "abort_reply")
        finally:
            control.close()

    def open_relayed(self):
        """TR: site-a's transfer to run/relayed naming site-c its relay, every
        chunk's digest vouched; records site-c's relay_attach."""
        tid = self.tids["TR"] = self.tid("t-owner-relayed")
        control = self.peer("site-a").control(tid)
        try:
            answer = control.open(tid, "ckpt", "run/relayed", self.manifest, single_file=True,
                                  relay_by="site-c")
            assert answer.ok(), answer
            pieces = [self.content[i:i + CHUNK] for i in range(0, len(self.content), CHUNK)]
            assert control.progress(tid, [(0, i, 0, p) for i, p in enumerate(pieces)]).ok()
        finally:
            control.close()
        relay = self.peer("site-c").control(tid)
        try:
            self.record("relay_attach", relay, RELAY_ATTACH, hp.message((1, tid), (2, "site-a")))
        finally:
            relay.close()

    def record_open_variants(self):
        """The owner's opens with each option that bears on authority, each
        of a transfer of its own."""
        owner = self.peer("site-a")
        one_file = hp.manifest([hp.manifest_file(MARKER, 11)])
        variants = {
            "open.single_file": dict(dest="run/one.bin", single_file=True),
            "open.keep_prune": dict(dest="run/step-3", keep_checkpoints=1,
                                    checkpoint_marker=MARKER),
            "open.relay_by": dict(dest="run/by-relay", relay_by="site-c"),
            "open.relay_to": dict(dest="run/to-relay", relay_to=("site-c", "t-downstream")),
            "open.checksum": dict(dest="run/step-1", skip_unchanged=True),
            "open.check_only": dict(dest="run/checked", skip_unchanged=True),
        }
        for name, args in variants.items():
            tid = self.tid("t-rec-" + name.split(".")[1].replace("_", "-"))
            dest = args.pop("dest")
            body = hp.open_request(tid, "ckpt", dest, one_file, **args)
            if name == "open.checksum":
                body = with_fields(body, f11=1)  # compare_content
            if name == "open.check_only":
                body = with_fields(body, f18=1)  # check_only
            control = owner.control(tid)
            try:
                self.record(name, control, OPEN, body)
                # Leave nothing half-open that would change under the replays.
                self.call(control, ABORT, hp.message((1, tid), (2, "recorded")))
            finally:
                control.close()

    def start_pull(self):
        """site-b pulls site-d's pullsrc into `pulled`; paused at site-d, the
        pull's grant holds. Its open is what site-d's daemon sent."""
        src = os.path.join(self.sites.export("site-d"), "pullsrc.bin")
        lh.write_random(src, 8 << 20, seed=SEED)
        self.sites.cli("d", "limit", "--peer", "site-b", "2Mbit", check=True)
        proc = self.sites.cli("b", "cp", "site-d:/ckpt/pullsrc.bin", "site-b:/ckpt/pulled.bin",
                              "--chunk-size", "64KiB", "--streams", "1",
                              "--json", check=True)
        tid = self.tids["pull"] = json.loads(proc.stdout)["id"]
        self.sites.wait_state("d", tid, {"RUNNING"})
        self.sites.cli("d", "pause", tid, check=True)
        self.sites.wait_state("d", tid, {"PAUSED"})
        self.sites.wait_state("b", tid, {"PAUSED"})
        m = hp.manifest([hp.manifest_file("pullsrc.bin", 8 << 20)])
        self.recorded["open.pull"] = (OPEN, hp.open_request(tid, "ckpt", "pulled.bin", m,
                                                           single_file=True,
                                                           requested_by="site-b"))

    def remote_copy(self):
        """site-d, a reader of site-b's export, has site-b copy run/step-1 to
        site-e (a third-party copy: site-d's own daemon asked for no pull)."""
        channel = self.peer("site-d").remote()
        try:
            spec = hp.transfer_spec("ckpt", "run/step-1", "site-e", "ckpt", "from-b")
            answer = self.record("remote_submit", channel, REMOTE_SUBMIT,
                                 hp.message((1, "req-reader"), (2, spec)), "remote_reply")
            tid = self.tids["remote"] = hp.decode(answer.body[1][0])[1][0].decode()
            self.sites.wait_state("b", tid, {"COMPLETED"})
            self.record("remote_get", channel, REMOTE_GET, hp.message((1, tid)))
            # A cancel of an ended copy changes nothing; it is the request replayed.
            self.recorded["remote_cancel"] = (REMOTE_CANCEL, hp.message((1, tid)))
        finally:
            channel.close()

    # -- the views compared before and after each replay --------------------

    def tree(self):
        """{relative path: (kind, size, sha256, mode)} of site-b's export,
        `.longhaul` (staging) included."""
        out = {}
        root = self.export()
        for dirpath, dirs, files in os.walk(root):
            for name in dirs + files:
                full = os.path.join(dirpath, name)
                st = os.lstat(full)
                digest = ""
                if stat.S_ISREG(st.st_mode):
                    with open(full, "rb") as f:
                        digest = hashlib.sha256(f.read()).hexdigest()
                out[os.path.relpath(full, root)] = (stat.S_IFMT(st.st_mode), st.st_size, digest,
                                                    stat.S_IMODE(st.st_mode))
        return out

    def journal(self):
        """site-b's journal as far as its operator and the owners see it."""
        listed = json.loads(self.sites.cli("b", "ls", "--all", "--json", check=True).stdout)
        transfers = sorted((t["id"], t["state"], t.get("error", ""), t["destination"],
                            t.get("source", ""), t.get("requested_by", ""), t["files"], t["bytes"])
                           for t in listed["transfers"])
        metrics = {name: self.sites.metric("site-b", name)
                   for name in ("longhaul_chunks_durable_total", "longhaul_bytes_durable_total")}
        progress = {}
        for key in ("T", "TR"):
            tid = self.tids[key]
            control = self.peer("site-a").control(tid)
            try:
                answer = control.progress(tid)
            finally:
                control.close()
            progress[key] = (answer.error, sorted((n, v) for n, v in answer.body.items()
                                                  if n in (1, 2, 3, 5)))
        return {"transfers": transfers, "metrics": metrics, "progress": progress}

    def snapshot(self):
        return self.tree(), self.journal()


class ReplayFailure(AssertionError):
    pass


class AuthoritySwapTest(unittest.TestCase):
    """Every catalogued peer and control operation, recorded and replayed
    under every other principal."""

    @classmethod
    def setUpClass(cls):
        cls.tokens = tempfile.mkdtemp(prefix="lh-swap-tokens-")
        for name, token in (("operator.token", OPERATOR_TOKEN), ("viewer.token", VIEWER_TOKEN)):
            path = os.path.join(cls.tokens, name)
            with open(path, "w") as f:
                f.write(token + "\n")
            os.chmod(path, 0o600)
        cls.swap = SwapSites(cls.tokens)
        try:
            cls.swap.up()
        except BaseException:
            cls.swap.sites.cleanup()
            shutil.rmtree(cls.tokens, ignore_errors=True)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.swap.sites.cleanup()
        shutil.rmtree(cls.tokens, ignore_errors=True)

    def fail_replay(self, what, detail):
        raise ReplayFailure(f"{what}: {detail}\nseed {SEED}; replay with: {REPLAY}")

    # -- the rules of a refusal ------------------------------------------

    def forbidden_words(self, principal_site):
        """What a principal may not learn unless it said it itself."""
        words = {self.swap.sites.dir, "shard-0.pt", MARKER, "run/step-1", "run/step-2",
                 "run/relayed", "run/abandoned", "pulled.bin", "pullsrc.bin", "from-b",
                 *self.swap.tids.values()}
        words |= {s for s in PEER_SITE.values() if s != principal_site}
        words.discard("site-b")  # the site it speaks to
        return words

    def assert_leaks_nothing(self, what, text, sent, principal_site):
        for word in sorted(self.forbidden_words(principal_site)):
            if word in text and word.encode() not in sent:
                self.fail_replay(what, f"the answer names {word!r}, which the principal did "
                                       f"not send: {text!r}")
        host_path = re.search(r"(?:^|[\s'\"(=,])(/[\w.-]+(?:/[\w.-]+)+)", text)
        if host_path and host_path.group(1).encode() not in sent:
            self.fail_replay(what, f"the answer names the host path {host_path.group(1)!r}: "
                                   f"{text!r}")

    # -- replays ---------------------------------------------------------

    def replay_control(self, site, tid, field, body, remote=False):
        peer = self.swap.peer(site)
        try:
            channel = peer.remote() if remote else peer.control(tid)
        except (ConnectionError, OSError, ssl.SSLError) as e:
            return Outcome(True, str(e))
        try:
            answer, _ = self.swap.call(channel, field, body)
            return Outcome(not answer.ok(), answer.error, answer.body_field)
        except (ConnectionError, OSError, ssl.SSLError) as e:
            return Outcome(True, f"(closed: {type(e).__name__})")
        finally:
            channel.close()

    def replay_frame(self, site, tid, kind, payload):
        """A frame on a DATA channel of `tid`: a CHUNK is answered by its ack
        (refused unless durable); a frame a destination never takes closes
        the channel."""
        channel = self.swap.peer(site).connect(hp.ROLE_DATA, tid)
        try:
            channel.sock.settimeout(30)
            channel.sock.sendall(hp._frame(kind, payload, channel.session))
            got, answer = channel.read_frame()
            if got != hp.CHUNK_ACK:
                return Outcome(True, f"(frame type {got})")
            result = int.from_bytes(answer[12:16], "little")
            return Outcome(result != hp.ACK_DURABLE, answer[16:].decode(errors="replace"),
                           result=result)
        except (ConnectionError, OSError, ssl.SSLError, ValueError) as e:
            return Outcome(True, f"(closed: {type(e).__name__})")
        finally:
            channel.close()

    # -- mutations -------------------------------------------------------

    def base_tid(self, principal, recorded_tid, is_open=False):
        """The transfer a principal's replay names as recorded: the relay acts
        on the transfer it relays, a pulled source opens under its pull."""
        if principal == cat.RELAY:
            return self.swap.tids["TR"]
        if principal == cat.PULLED_SOURCE and is_open:
            return self.swap.tids["pull"]
        return recorded_tid

    def other_transfers(self, principal, tid):
        """Transfers that are not the site of `principal`'s own, for the
        "another transfer" mutation (site-c relays TR, site-d sends the pull)."""
        own = {"site-c": "TR", "site-d": "pull"}.get(PEER_SITE[principal])
        # "remote" is site-b's own outgoing copy, no transfer into site-b: an
        # abort of it by a writer is the tombstone of a transfer never
        # opened, allowed by design (SECURITY.md, abort).
        return sorted(set(self.swap.tids.values())
                      - {tid, self.swap.tids.get(own), self.swap.tids["remote"]})

    def mutate(self, rng, name, principal, body, as_recorded=False, must_mutate=False):
        """The recorded body as `principal` replays it, with one seeded
        mutation (or none: `as_recorded`); returns (transfer id, body, what
        was done)."""
        fields = hp.decode(body)
        is_open = name.startswith("open")
        tid = self.base_tid(principal, fields.get(1, [b""])[0].decode(), is_open)
        choices = ["as recorded", "another transfer"]
        if is_open:
            choices += ["a .. path", "another export"]
        if name == "relay_attach":
            choices.append("another owner")
        if must_mutate:
            choices.remove("as recorded")
        choice = "as recorded" if as_recorded else rng.choice(choices)
        if choice == "another transfer":
            tid = rng.choice(self.other_transfers(principal, tid))
            choice += " " + tid
        changes = {"f1": tid}
        if principal == cat.PULLED_SOURCE and is_open:
            changes["f15"] = "site-b"
        if choice == "a .. path":
            changes["f4"] = rng.choice(["../" + fields[4][0].decode(), "run/../../escape",
                                        "run/step-1/../../../x"])
        if choice == "another owner":
            changes["f2"] = rng.choice(["site-c", "site-d", "site-e", ""])
            choice += " " + repr(changes["f2"])
        if choice == "another export":
            changes["f3"] = rng.choice(["local", "ckpt2", ".longhaul"])
        return tid, with_fields(body, **changes), choice

    # -- the test --------------------------------------------------------

    def test_every_peer_operation_replayed_under_every_other_principal(self):
        rng = random.Random(SEED)
        plan = []
        for op in cat.CATALOGUE:
            if op.kind not in (cat.PEER_REQUEST, cat.REMOTE_REQUEST, cat.REPLY, cat.FRAME):
                continue
            if not op.replays:
                continue
            for principal, outcome in op.replays.items():
                plan.append((op, principal, False))
                if outcome != cat.REFUSED:
                    # Allowed as recorded: its effect is asserted, and a
                    # mutation of it must still be refused.
                    plan.append((op, principal, True))
        rng.shuffle(plan)
        self.assertGreater(len(plan), 60)
        before = self.swap.snapshot()
        replayed = 0
        for op, principal, as_recorded in plan:
            what = f"{op.name} replayed by {principal} ({PEER_SITE[principal]})"
            outcome, sent, mutation = self.replay(rng, op, principal, as_recorded)
            what += f", {mutation}"
            if VERBOSE:
                print(f"{what}: {outcome}", file=sys.stderr)
            expected = op.replays[principal]
            if expected == cat.REFUSED or not mutation.startswith("as recorded"):
                if not outcome.refused:
                    self.fail_replay(what, f"was not refused: {outcome}")
                if outcome.body_field is not None:
                    self.fail_replay(what, f"the refusal carries an answer body: {outcome}")
                self.assert_leaks_nothing(what, outcome.text, sent, PEER_SITE[principal])
                after = self.swap.snapshot()
                if after != before:
                    self.fail_replay(what, self.describe_change(before, after))
            else:
                self.assert_allowed(what, op, principal, outcome)
                before = self.swap.snapshot()
            replayed += 1
        print(f"authority swap: {replayed} replays, seed {SEED}", file=sys.stderr)
        self.owner_finishes_what_it_started()

    def replay(self, rng, op, principal, as_recorded):
        """Replays `op` as `principal`: as recorded when `as_recorded`, else
        mutated by the seed (always, where the catalogue allows the replay as
        recorded). Returns (Outcome, the bytes sent, the mutation)."""
        site = PEER_SITE[principal]
        must_mutate = op.replays[principal] != cat.REFUSED and not as_recorded
        if op.name == "chunk":
            chunk = self.swap.recorded["chunk"][1]
            tid = self.base_tid(principal, self.swap.tids["T"])
            mutation = "as recorded"
            if not as_recorded and (must_mutate or rng.random() < 0.5):
                tid = rng.choice(self.other_transfers(principal, tid))
                mutation = "another transfer " + tid
            return self.replay_frame(site, tid, hp.CHUNK, chunk), chunk, mutation
        if op.kind == cat.FRAME:
            kind = {"frame.CHUNK_ACK": hp.CHUNK_ACK, "frame.CHUNK_PROGRESS": 5}[op.name]
            payload = (b"\0" * 16 if kind == hp.CHUNK_ACK
                       else b"\0" * 16 + (1000).to_bytes(8, "little"))
            return (self.replay_frame(site, self.swap.tids["T"], kind, payload), payload,
                    "as recorded")
        if op.kind == cat.REPLY:
            body = self.swap.answers[op.name]
            field = REPLY_FIELDS[op.name]
            tid = self.base_tid(principal, self.swap.tids["T"])
            return self.replay_control(site, tid, field, body), body, "as recorded"
        field, body = self.swap.recorded[op.name]
        if op.kind == cat.REMOTE_REQUEST:
            return self.replay_remote(rng, op, site, field, body)
        tid, body, mutation = self.mutate(rng, op.name, principal, body, as_recorded, must_mutate)
        return self.replay_control(site, tid, field, body), body, mutation

    def replay_remote(self, rng, op, site, field, body):
        mutation = rng.choice(["as recorded", "another transfer" if op.name != "remote_submit"
                               else "a .. path"])
        if op.name == "remote_submit":
            spec = hp.decode(hp.decode(body)[2][0])
            if mutation == "a .. path":
                spec[22] = [b"../site-b/state"]
            body = hp.message((1, f"req-{site}-{rng.randrange(1 << 30)}"), (2, encode(spec)))
        elif mutation == "another transfer":
            body = hp.message((1, rng.choice(sorted(self.swap.tids.values()))))
        return self.replay_control(site, "", field, body, remote=True), body, mutation

    def assert_allowed(self, what, op, principal, outcome):
        if (op.name, principal) == ("chunk", cat.RELAY):
            # The relay's chunk matches the owner's digest: taken.
            self.assertEqual(outcome.result, hp.ACK_DURABLE, f"{what}: {outcome}")
            return
        if (op.name, principal) == ("relay_attach", cat.RELAY):
            # Answered like an open: the chunks site-b holds.
            self.assertFalse(outcome.refused, f"{what}: {outcome}")
            self.assertEqual(outcome.body_field, OPEN_REPLY, f"{what}: {outcome}")
            return
        self.fail_replay(what, f"allowed by the catalogue but the harness has no assertion of "
                               f"its effect: {outcome}")

    def describe_change(self, before, after):
        lines = []
        (tree0, journal0), (tree1, journal1) = before, after
        for path in sorted(set(tree0) | set(tree1)):
            if tree0.get(path) != tree1.get(path):
                lines.append(f"export {path}: {tree0.get(path)} -> {tree1.get(path)}")
        for key in journal0:
            if journal0[key] != journal1[key]:
                lines.append(f"journal {key}: {journal0[key]} -> {journal1[key]}")
        return "site-b changed: " + "; ".join(lines)

    # -- the control API -------------------------------------------------

    def control_cli(self, principal, *args):
        """`longhaul` against site-b as `principal`: root or nobody on the
        control socket, or the viewer token on the TCP control address."""
        binary = os.path.join(lh.BIN, "longhaul")
        if principal == cat.VIEWER_TOKEN:
            cmd = [binary, "--daemon", self.swap.tcp_address, "--token-file",
                   os.path.join(self.tokens, "viewer.token"), *args]
        else:
            cmd = [binary, "--daemon", self.swap.sites.env["LONGHAUL_SITE_B"], *args]
            if principal == cat.LOCAL_USER:
                cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                       "--", *cmd]
        env = {k: v for k, v in os.environ.items() if k != "LONGHAUL_TOKEN_FILE"}
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)

    def control_calls(self, rng):
        """{rpc: the CLI arguments that make it}, recorded by root."""
        ended = self.swap.tids["remote"]
        return {
            # A push of what nobody may not read, the same into a `..` path, or
            # a pull into site-b's export, where nobody may not write.
            "Submit": rng.choice([("cp", self.root_only, "site-e:/ckpt/sub.bin", "--json"),
                                  ("cp", self.root_only, "site-e:/ckpt/../sub.bin", "--json"),
                                  ("cp", "site-d:/ckpt/pullsrc.bin",
                                   "site-b:/ckpt/nobody-pulled.bin", "--json")]),
            "Get": ("status", ended, "--json"),
            "List": ("ls", "--all", "--json"),
            "Watch": ("status", ended, "--watch", "--json"),
            "Verify": ("verify", ended, "--json"),
            "Peers": ("peers", "--json"),
            "GetLimits": ("limit", "--json"),
            "Cancel": ("cancel", self.sacrificial),
            "Pause": ("pause", self.sacrificial),
            "Resume": ("resume", self.sacrificial),
            "SetLimit": ("limit", "--class", "background", "300Mbit"),
        }

    def start_sacrificial(self):
        """A slow push from site-b to site-e, paused: what a local user's
        allowed pause, resume and cancel act on."""
        src = os.path.join(self.swap.sites.dir, "sacrificial.bin")
        lh.write_random(src, 4 << 20, seed=SEED + 1)
        self.swap.sites.cli("b", "limit", "--peer", "site-e", "1Mbit", check=True)
        proc = self.swap.sites.cli("b", "cp", src, "site-e:/ckpt/sacrificial.bin", "--chunk-size",
                                   "64KiB", "--streams", "1", "--json", check=True)
        tid = json.loads(proc.stdout)["id"]
        self.swap.sites.cli("b", "pause", tid, check=True)
        self.swap.sites.wait_state("b", tid, {"PAUSED"})
        return tid

    def test_every_control_call_replayed_by_a_local_user_and_a_viewer_token(self):
        rng = random.Random(SEED)
        self.root_only = os.path.join(self.swap.sites.dir, "root-only.bin")
        lh.write_random(self.root_only, 4096, seed=SEED)
        os.chmod(self.root_only, 0o600)
        self.sacrificial = self.start_sacrificial()
        calls = self.control_calls(rng)
        # The legitimate caller: every read answers; the submit goes through.
        recorded = {}
        for rpc in ("Get", "List", "Peers", "GetLimits", "Verify", "Watch"):
            proc = self.control_cli(cat.LOCAL_OPERATOR, *calls[rpc])
            self.assertEqual(proc.returncode, 0, f"root {rpc}: {proc.stderr}")
            recorded[rpc] = proc.stdout
        plan = [(op, p) for op in cat.CATALOGUE if op.kind == cat.CONTROL_RPC for p in op.replays]
        rng.shuffle(plan)
        # A local user's allowed pause, resume and cancel change the
        # sacrificial transfer: they go last, in that order.
        changing = ("Pause", "Resume", "Cancel")
        effects = [(op, p) for op, p in plan
                   if p == cat.LOCAL_USER and op.proto.split(".")[1] in changing]
        plan = [x for x in plan if x not in effects]
        effects.sort(key=lambda x: changing.index(x[0].proto.split(".")[1]))
        before = self.swap.snapshot()
        for op, principal in plan + effects:
            rpc = op.proto.split(".")[1]
            what = f"control {rpc} by {principal}"
            proc = self.control_cli(principal, *calls[rpc])
            text = proc.stdout + proc.stderr
            if VERBOSE:
                print(f"{what} {calls[rpc]}: exit {proc.returncode}: {text.strip()[:300]}",
                      file=sys.stderr)
            if op.replays[principal] == cat.REFUSED:
                if proc.returncode == 0:
                    self.fail_replay(what, f"was not refused: {text}")
                self.assertIn(proc.returncode, (1, 2), f"{what}: {text}")
                if principal == cat.VIEWER_TOKEN:
                    self.assertIn(f"the viewer role may not {rpc}", text)
                    self.assert_leaks_nothing(what, text, b"", "")
                else:
                    self.assertIn("may not", text)
                after = self.swap.snapshot()
                if after != before:
                    self.fail_replay(what, self.describe_change(before, after))
                continue
            self.assertEqual(proc.returncode, 0, f"{what} is allowed: {text}")
            if rpc in recorded and rpc not in ("Peers", "Watch"):
                # The same view as the operator's, no more.
                self.assertEqual(proc.stdout, recorded[rpc], what)
            if rpc in ("Pause", "Resume", "Cancel"):
                state = {"Pause": {"PAUSED"}, "Resume": {"QUEUED", "RUNNING"},
                         "Cancel": {"CANCELLED"}}[rpc]
                self.swap.sites.wait_state("b", self.sacrificial, state)
            if rpc == "SetLimit":
                limits = self.control_cli(cat.LOCAL_OPERATOR, "limit", "--json").stdout
                self.assertIn("background", limits)
                self.swap.sites.cli("b", "limit", "--class", "background", "off", check=True)
            before = self.swap.snapshot()
        self.assertFalse(os.path.exists(os.path.join(self.swap.sites.export("site-e"), "sub.bin")))
        self.assertFalse(os.path.exists(self.swap.export("nobody-pulled.bin")))

    def grpc_over_tcp(self, method, token):
        """Calls `method` ("Service/Method", an empty request) on site-b's
        TCP control address with `token`, as any gRPC client could; returns
        the grpc-status it answered, or None when it answered none."""
        proc = subprocess.run(
            ["curl", "-s", "--http2-prior-knowledge", "-X", "POST", "-H",
             "content-type: application/grpc", "-H", "te: trailers", "-H",
             f"authorization: Bearer {token}", "--data-binary", "@-", "-D", "-", "-o",
             os.devnull, f"http://{self.swap.tcp_address}/longhaul.v1.{method}"],
            input=b"\0\0\0\0\0", capture_output=True, timeout=60)
        found = re.search(rb"grpc-status: (\d+)", proc.stdout)
        return int(found.group(1)) if found else None

    def test_the_exchange_service_is_not_served_to_a_viewer_token(self):
        # The same client reaches the Control service with the same token.
        self.assertEqual(self.grpc_over_tcp("Control/GetLimits", VIEWER_TOKEN), 0)
        before = self.swap.snapshot()
        for op in cat.CATALOGUE:
            if op.kind != cat.EXCHANGE_RPC:
                continue
            self.assertEqual(op.replays[cat.VIEWER_TOKEN], cat.REFUSED, op.name)
            status = self.grpc_over_tcp(op.proto, VIEWER_TOKEN)
            if status == 0:
                self.fail_replay(f"{op.proto} by the viewer token", "was served")
        after = self.swap.snapshot()
        if after != before:
            self.fail_replay("the Exchange service by the viewer token",
                             self.describe_change(before, after))

    def owner_finishes_what_it_started(self):
        """After every replay, the owner's in-flight transfer resumes where
        it stood and publishes the owner's bytes; its published checkpoint
        verifies."""
        tid = self.swap.tids["T"]
        answer = self.swap.peer("site-a").publish(tid, "ckpt", "run/step-2",
                                                  {"x.bin": (self.swap.content, 0o644)},
                                                  single_file=True)
        self.assertTrue(answer.ok(), answer)
        with open(self.swap.export("run", "step-2"), "rb") as f:
            self.assertEqual(f.read(), self.swap.content)
        control = self.swap.peer("site-a").control(self.swap.tids["P"])
        try:
            self.assertTrue(control.verify(self.swap.tids["P"]).ok())
        finally:
            control.close()


if __name__ == "__main__":
    unittest.main()
