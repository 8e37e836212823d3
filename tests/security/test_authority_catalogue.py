"""The authority-swap catalogue covers the whole protocol (ctest label
`security`): every PeerMessage body, Hello role, frame type, exchange
message kind and gRPC method found in the sources has its entry in
authority_catalogue.py, and every entry names something that exists. A new
message type without an entry fails here, naming it."""

import os
import re
import unittest

import authority_catalogue as catalogue

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PROTO_DIR = os.path.join(ROOT, "proto", "longhaul", "v1")
FRAMES_H = os.path.join(ROOT, "daemon", "wire", "frames.h")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _without_comments(text):
    return re.sub(r"//[^\n]*", "", text)


def _block(text, opener):
    """The body between the braces after `opener` (a regex), nested braces
    included; raises when `opener` is not found, so a renamed message fails
    loudly instead of listing nothing."""
    found = re.search(opener + r"\s*\{", text)
    if not found:
        raise AssertionError(f"no {opener!r} in the protocol sources")
    depth, start = 1, found.end()
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    raise AssertionError(f"unbalanced braces after {opener!r}")


def _enum_values(text, enum):
    return [name for name in re.findall(r"\b([A-Z][A-Z0-9_]*)\s*=\s*\d+\s*;",
                                        _block(text, rf"\benum\s+{enum}\b"))
            if not name.endswith("UNSPECIFIED")]


def protocol_names(peer_proto, control_proto, exchange_proto, frames_h):
    """Every name the catalogue must cover, as "Scope.name", from the texts
    of peer.proto, control.proto, exchange.proto and daemon/wire/frames.h."""
    peer, control, exchange = map(_without_comments, (peer_proto, control_proto, exchange_proto))
    names = set()
    oneof = _block(_block(peer, r"\bmessage\s+PeerMessage\b"), r"\boneof\s+body\b")
    names |= {f"PeerMessage.{field}"
              for field in re.findall(r"^\s*\w+\s+(\w+)\s*=\s*\d+\s*;", oneof, re.M)}
    hello = _block(peer, r"\bmessage\s+Hello\b")
    names |= {f"Hello.{role}" for role in _enum_values(hello, "Role")}
    names |= {f"ExchangePeerMessage.{kind}"
              for kind in _enum_values(_block(exchange, r"\bmessage\s+ExchangePeerMessage\b"),
                                       "Kind")}
    for text in (control, exchange):
        for service, body in re.findall(r"\bservice\s+(\w+)\s*\{([^}]*)\}", text):
            names |= {f"{service}.{rpc}" for rpc in re.findall(r"\brpc\s+(\w+)\s*\(", body)}
    frame_types = _block(_without_comments(frames_h), r"\benum\s+class\s+FrameType\b[^{]*")
    for constant in re.findall(r"\bk([A-Z]\w*)\s*=\s*\d+", frame_types):
        names.add("frame." + re.sub(r"(?<!^)(?=[A-Z])", "_", constant).upper())
    return names


def coverage_problems(names, operations):
    """What is wrong between the protocol's `names` and the catalogue's
    `operations`: one line per missing entry, stale entry or entry that says
    nothing about its replays."""
    covered = catalogue.covered_protos(operations)
    problems = [f"{name} is in the protocol but not in tests/security/authority_catalogue.py: "
                "add an Operation for it (who may do it, what every other principal gets)"
                for name in sorted(names - covered)]
    problems += [f"{name} is in the catalogue but no longer in the protocol: remove or rename it"
                 for name in sorted(covered - names)]
    for op in operations:
        if not op.replays and not op.note:
            problems.append(f"{op.name}: neither replays nor a note saying why it has none")
        if op.replays and not op.legitimate and op.kind != catalogue.REPLY \
                and op.kind != catalogue.FRAME:
            problems.append(f"{op.name}: replays without the legitimate principal to record")
        for principal, outcome in op.replays.items():
            if outcome != catalogue.REFUSED and not (isinstance(outcome, catalogue.Allowed)
                                                    and outcome.why):
                problems.append(f"{op.name}: {principal} is neither refused nor allowed with "
                                "a reason")
    return problems


def current_sources():
    return (_read(os.path.join(PROTO_DIR, "peer.proto")),
            _read(os.path.join(PROTO_DIR, "control.proto")),
            _read(os.path.join(PROTO_DIR, "exchange.proto")),
            _read(FRAMES_H))


class CatalogueCoverageTest(unittest.TestCase):

    def test_every_message_rpc_role_and_frame_type_is_catalogued(self):
        names = protocol_names(*current_sources())
        # The parse itself found what is known to exist.
        for known in ("PeerMessage.open", "PeerMessage.progress_reply", "Hello.REMOTE",
                      "frame.CHUNK_PROGRESS", "ExchangePeerMessage.BCAST_DATA",
                      "Control.GetLimits", "Exchange.Broadcast"):
            self.assertIn(known, names)
        problems = coverage_problems(names, catalogue.CATALOGUE)
        self.assertEqual(problems, [], "\n".join(problems))

    def test_an_invented_message_rpc_role_or_kind_fails_naming_it(self):
        peer, control, exchange, frames = current_sources()
        invented = (
            (peer.replace("ProgressReply progress_reply = 16;",
                          "ProgressReply progress_reply = 16;\n    PurgeRequest purge = 17;"),
             control, exchange, frames, "PeerMessage.purge"),
            (peer.replace("REMOTE = 6;", "REMOTE = 6;\n    ADMIN = 7;"),
             control, exchange, frames, "Hello.ADMIN"),
            (peer, control.replace("rpc GetLimits(", "rpc Shutdown(Empty) returns (Empty);\n"
                                                     "  rpc GetLimits("),
             exchange, frames, "Control.Shutdown"),
            (peer, control,
             exchange.replace("BCAST_DATA = 11;", "BCAST_DATA = 11;\n    EVICT = 12;"),
             frames, "ExchangePeerMessage.EVICT"),
            (peer, control, exchange,
             frames.replace("kChunkProgress = 5,", "kChunkProgress = 5,\n  kChunkNack = 6,"),
             "frame.CHUNK_NACK"),
        )
        for *sources, name in invented:
            with self.subTest(name=name):
                problems = coverage_problems(protocol_names(*sources), catalogue.CATALOGUE)
                self.assertEqual(len(problems), 1, problems)
                self.assertIn(f"{name} is in the protocol but not in", problems[0])

    def test_a_stale_or_undecided_entry_fails_naming_it(self):
        names = protocol_names(*current_sources())
        stale = catalogue.Operation("purge", catalogue.PEER_REQUEST, "PeerMessage.purge",
                                    catalogue.OWNER, {catalogue.RELAY: catalogue.REFUSED})
        undecided = catalogue.Operation("open.undecided", catalogue.PEER_REQUEST,
                                        "PeerMessage.open", catalogue.OWNER,
                                        {catalogue.RELAY: catalogue.Allowed()})
        problems = coverage_problems(names, (*catalogue.CATALOGUE, stale, undecided))
        self.assertEqual(problems, [
            "PeerMessage.purge is in the catalogue but no longer in the protocol: "
            "remove or rename it",
            "open.undecided: relay is neither refused nor allowed with a reason"])


if __name__ == "__main__":
    unittest.main()
