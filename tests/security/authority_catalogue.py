"""The authority-swap catalogue: every operation a peer, a local caller or a
token holder can ask a daemon for, whose authority it uses, and what each
other principal gets when it replays it.

test_authority_catalogue.py fails when the protocol has something this file
does not list (a PeerMessage body, a Hello role, a frame type, an exchange
message kind, a gRPC method); test_authority_swap.py replays each entry
under every principal of its `replays` against real daemons and asserts
that the destination's tree and journal are unchanged and the answer leaks
nothing, except where an outcome is `Allowed`, whose effect it asserts.

Adding an operation: add its `Operation` here (its `proto` names what the
coverage test finds in the .proto files; a variant of a message, such as an
open with `compare_content`, repeats the proto name with its own `name`),
say who may do it (`legitimate`), and what every other principal gets.
The replay test finds the way to record and replay it by `name`.
"""

import dataclasses

# ------------------------------------------------------------ principals ----
# The parties whose authority an operation may use. At a destination site
# (site-b in the replay test) whose export lists writers and readers:
OWNER = "owner"                  # the site that opened the transfer: a writer
NOT_WRITER = "not_writer"        # a configured peer the export lists nowhere
READER_ONLY = "reader_only"      # a peer in the export's readers, not its writers
RELAY = "relay"                  # a writer the owner's open names as relay_by
PULLED_SOURCE = "pulled_source"  # the source of this site's pull: a grant for one path
THIRD_SITE = "third_site"        # another writer of the export, not this transfer's owner
# On the control socket and the TCP control address:
LOCAL_OPERATOR = "local_operator"  # root on the control socket
LOCAL_USER = "local_user"          # uid nobody, admitted by the socket's mode
VIEWER_TOKEN = "viewer_token"      # the TCP control address with the viewer token
# Between the members of an exchange group:
MEMBER = "member"
NON_MEMBER = "non_member"        # a configured peer that is no member of the group

PEER_PRINCIPALS = (NOT_WRITER, READER_ONLY, RELAY, PULLED_SOURCE, THIRD_SITE)
CONTROL_PRINCIPALS = (LOCAL_USER, VIEWER_TOKEN)

# ---------------------------------------------------------------- kinds ----
PEER_REQUEST = "peer request"        # a PeerMessage body a peer sends to be served
REMOTE_REQUEST = "remote request"    # a PeerMessage body on a REMOTE channel, to a source
REPLY = "reply"                      # a PeerMessage body that only answers
FRAME = "frame"                      # a frame type (daemon/wire/frames.h)
HELLO_ROLE = "hello role"            # a Hello.Role: what a channel is for
EXCHANGE_KIND = "exchange kind"      # an ExchangePeerMessage.Kind
CONTROL_RPC = "control rpc"          # a method of service Control
EXCHANGE_RPC = "exchange rpc"        # a method of service Exchange


REFUSED = "refused"


@dataclasses.dataclass(frozen=True)
class Allowed:
    """A replay allowed by design; `why` says which rule allows it."""
    why: str = ""


@dataclasses.dataclass(frozen=True)
class Operation:
    name: str                    # unique; the replay test dispatches on it
    kind: str
    proto: str                   # e.g. "PeerMessage.open", "Control.Submit"
    legitimate: str = ""         # the principal recorded doing it
    replays: dict = dataclasses.field(default_factory=dict)  # principal -> REFUSED | Allowed
    # For an answer, an exchange kind or a role that is not replayed here:
    # why, and which tests hold the rule.
    note: str = ""
    covered_by: str = ""


def _refused_by(*principals):
    return {p: REFUSED for p in principals}


_PEER_REFUSED = _refused_by(*PEER_PRINCIPALS)


def _peer(name, proto, **overrides):
    replays = dict(_PEER_REFUSED)
    replays.update(overrides)
    return Operation(name, PEER_REQUEST, proto, OWNER, replays)


def _reply(proto, answers):
    return Operation(proto.split(".")[1], REPLY, proto,
                     note=f"an answer to {answers}: a daemon sends it only in reply on a "
                          "channel it dialed, and a destination serving CONTROL refuses it as "
                          "a request (replayed as one by test_authority_swap.py)",
                     replays=_refused_by(OWNER, *PEER_PRINCIPALS))


CATALOGUE = (
    # -- peer requests at a destination: each replayed under every peer principal
    _peer("open", "PeerMessage.open"),
    _peer("open.single_file", "PeerMessage.open"),
    _peer("open.checksum", "PeerMessage.open"),
    # Submit's check and --dry-run: decided as an open, nothing kept; of a
    # known transfer id refused to everyone, its owner included.
    _peer("open.check_only", "PeerMessage.open"),
    _peer("open.keep_prune", "PeerMessage.open"),
    # The pulled source's own open, under its grant (site-d plays both the
    # pulled source and the reader, so the reader's replay is the same one).
    Operation("open.pull", PEER_REQUEST, "PeerMessage.open", PULLED_SOURCE,
              _refused_by(OWNER, NOT_WRITER, RELAY, THIRD_SITE)),
    _peer("open.relay_by", "PeerMessage.open"),
    _peer("open.relay_to", "PeerMessage.open"),
    _peer("chunk", "frame.CHUNK",
          relay=Allowed("the relay the owner's open names sends the transfer's chunks; each is "
                        "taken only when its bytes hash to the digest the owner sent over its "
                        "own session (SECURITY.md, write a chunk)")),
    _peer("commit", "PeerMessage.commit"),
    _peer("abort", "PeerMessage.abort"),
    _peer("verify", "PeerMessage.verify"),
    _peer("progress", "PeerMessage.progress"),
    # The third site is the relay's site: its attach as recorded is the relay's.
    # The relay's own, replayed mutated (another transfer, another owner than
    # the transfer's source), is refused.
    Operation("relay_attach", PEER_REQUEST, "PeerMessage.relay_attach", RELAY,
              dict(_refused_by(OWNER, NOT_WRITER, READER_ONLY, PULLED_SOURCE),
                   relay=Allowed("the relay the owner's open names attaches to that transfer, "
                                 "naming that owner (SECURITY.md, attach as a relay)"))),
    # -- requests to a source, on a REMOTE channel: the legitimate requester
    # is a reader of the source's export (the replay test's reader_only).
    Operation("remote_submit", REMOTE_REQUEST, "PeerMessage.remote_submit", READER_ONLY,
              _refused_by(OWNER, NOT_WRITER, THIRD_SITE)),
    Operation("remote_get", REMOTE_REQUEST, "PeerMessage.remote_get", READER_ONLY,
              _refused_by(OWNER, NOT_WRITER, THIRD_SITE)),
    Operation("remote_cancel", REMOTE_REQUEST, "PeerMessage.remote_cancel", READER_ONLY,
              _refused_by(OWNER, NOT_WRITER, THIRD_SITE)),
    # -- answers
    _reply("PeerMessage.open_reply", "open and relay_attach"),
    _reply("PeerMessage.commit_reply", "commit"),
    _reply("PeerMessage.abort_reply", "abort"),
    _reply("PeerMessage.verify_reply", "verify"),
    _reply("PeerMessage.progress_reply", "progress"),
    _reply("PeerMessage.remote_reply", "remote_submit, remote_get and remote_cancel"),
    # -- frame types
    Operation("frame.HELLO", FRAME, "frame.HELLO",
              note="the first frame of every channel; its role is catalogued as hello.*"),
    Operation("frame.CONTROL", FRAME, "frame.CONTROL",
              note="carries a PeerMessage (catalogued by body) or an ExchangePeerMessage "
                   "(catalogued by kind)"),
    Operation("frame.CHUNK_ACK", FRAME, "frame.CHUNK_ACK", replays=_refused_by(OWNER),
              note="an answer to CHUNK: the destination sends it; one sent to a destination "
                   "closes the data channel (replayed by test_authority_swap.py)"),
    Operation("frame.CHUNK_PROGRESS", FRAME, "frame.CHUNK_PROGRESS", replays=_refused_by(OWNER),
              note="an answer to CHUNK, like CHUNK_ACK (replayed by test_authority_swap.py)"),
    # -- channel roles
    Operation("hello.CONTROL", HELLO_ROLE, "Hello.CONTROL",
              note="the channel of the peer requests above, each replayed on it"),
    Operation("hello.DATA", HELLO_ROLE, "Hello.DATA", note="the channel of chunk, replayed on it"),
    Operation("hello.REMOTE", HELLO_ROLE, "Hello.REMOTE",
              note="the channel of remote_submit/get/cancel, replayed on it"),
    Operation("hello.PROBE", HELLO_ROLE, "Hello.PROBE",
              note="handshake only: it asks for nothing; any configured peer may probe "
                   "(longhaul peers), and the daemon closes the channel after the HELLO"),
    Operation("hello.UDP_HANDSHAKE", HELLO_ROLE, "Hello.UDP_HANDSHAKE",
              note="key agreement for a udp flow: grants a flow to the authenticated peer "
                   "only, for channels that carry the requests above with the same checks",
              covered_by="UdpTransportTest.*, TlsRevocationTest."
                         "ReloadAbortsTheRevokedPeersChannelsAndFlowsOnly"),
    Operation("hello.EXCHANGE", HELLO_ROLE, "Hello.EXCHANGE",
              note="the channel of the exchange kinds below"),
    # -- exchange message kinds: a member's are trusted within the group;
    # a non-member's are never taken by the group's calls.
    *(Operation(f"exchange.{kind}", EXCHANGE_KIND, f"ExchangePeerMessage.{kind}", MEMBER,
                _refused_by(NON_MEMBER),
                note="a non-member's message is kept unclaimed within its peer_limits and "
                     "never taken by the group's calls",
                covered_by="test_authority_swap_exchange.py: ExchangeSwapTest "
                           "[security.authority_swap_exchange]; test_abuse_exchange.py: "
                           "ExchangeAbuseTest [security.abuse_exchange]; "
                           "ExchangeHubMembershipTest.*, HostileDone/DivergenceTest.*")
      for kind in ("JOIN", "REDUCE_DATA", "ABORT", "P2P", "LEAVE", "DISCARD", "DONE",
                   "REFUSED", "REDUCE_RESULT", "GATHER_DATA", "BCAST_DATA")),
    # -- the control API: root on the socket is the legitimate caller
    Operation("control.Submit", CONTROL_RPC, "Control.Submit", LOCAL_OPERATOR,
              _refused_by(LOCAL_USER, VIEWER_TOKEN),
              note="a local user may send only what its uid may read: replayed with a "
                   "root-only source"),
    *(Operation(f"control.{rpc}", CONTROL_RPC, f"Control.{rpc}", LOCAL_OPERATOR,
                {LOCAL_USER: Allowed("reading: any caller the control socket admits"),
                 VIEWER_TOKEN: Allowed("reading is the viewer role's")})
      for rpc in ("Get", "List", "Watch", "Verify", "Peers", "GetLimits")),
    *(Operation(f"control.{rpc}", CONTROL_RPC, f"Control.{rpc}", LOCAL_OPERATOR,
                {LOCAL_USER: Allowed("intended: the control socket's group are the site's "
                                     "operators, who may cancel, pause, resume and cap any "
                                     "transfer (SECURITY.md, Intended)"),
                 VIEWER_TOKEN: REFUSED})
      for rpc in ("Cancel", "Pause", "Resume", "SetLimit")),
    # -- the exchange API: local processes only, never the TCP address
    *(Operation(f"exchange_rpc.{rpc}", EXCHANGE_RPC, f"Exchange.{rpc}", LOCAL_OPERATOR,
                {LOCAL_USER: Allowed("a training process exchanges through the segments it "
                                     "registered itself; a request names them by a token only "
                                     "the registering connection learns"),
                 VIEWER_TOKEN: REFUSED},
                note="control_listen does not serve the Exchange service (replayed with the "
                     "viewer token by test_authority_swap.py); a local user's calls are not "
                     "replayed there",
                covered_by="ExchangeDaemonTest.RequestsNamingUnsealedMemoryFailAloneWithAReason; "
                           "test_abuse_shm.py [security.abuse_shm]")
      for rpc in ("Join", "Leave", "Group", "AllReduce", "Send", "Recv", "Cancel", "AllGather",
                  "Broadcast")),
)

BY_NAME = {op.name: op for op in CATALOGUE}
assert len(BY_NAME) == len(CATALOGUE), "catalogue names must be unique"


def covered_protos(catalogue=CATALOGUE):
    return {op.proto for op in catalogue}
