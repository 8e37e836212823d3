"""A hostile peer for tests: speaks longhaul's peer protocol (proto/FRAMES.md,
proto/longhaul/v1/peer.proto) with a valid site certificate, and sends
whatever a test crafts: opens for any export and path, manifests with any
modes, chunks, commits, aborts and verifies of any transfer id.

It depends on nothing but the standard library and libxxhash (for the chunk
digests and session ids, through ctypes): protobuf messages are encoded by
field number here, so a test can also send what no real sender would.
"""

import ctypes
import os
import socket
import ssl
import struct

MAGIC = 0x4D46484C
HELLO, CONTROL, CHUNK, CHUNK_ACK = 1, 2, 3, 4
ROLE_CONTROL, ROLE_DATA = 1, 2
ROLE_REMOTE = 6
PROTOCOL_VERSION = 1
ACK_DURABLE, ACK_HASH_MISMATCH, ACK_RETRY_LATER, ACK_REFUSED = 0, 1, 2, 3
MIN_CHUNK_SIZE = 64 << 10

# absl::StatusCode values that answers carry in PeerMessage.error_code.
PERMISSION_DENIED = 7
UNAVAILABLE = 14


# ---------------------------------------------------------------- xxhash ----

class _Xxh128(ctypes.Structure):
    _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]


_xxhash = ctypes.CDLL("libxxhash.so.0")
_xxhash.XXH3_64bits.restype = ctypes.c_uint64
_xxhash.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_xxhash.XXH3_128bits.restype = _Xxh128
_xxhash.XXH3_128bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def session_id(transfer_id):
    data = transfer_id.encode()
    return _xxhash.XXH3_64bits(data, len(data))


def xxh128(data):
    h = _xxhash.XXH3_128bits(bytes(data), len(data))
    return h.low64, h.high64


# -------------------------------------------------------- protobuf wire ----

def _varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def message(*fields):
    """Encodes (field number, value) pairs: int/bool as varint, str/bytes
    (nested messages are bytes from message()) length-delimited, a list as a
    repeated field. None values are left out."""
    out = bytearray()
    for number, value in fields:
        values = value if isinstance(value, list) else [value]
        for v in values:
            if v is None:
                continue
            if isinstance(v, (bool, int)):
                out += _varint(number << 3) + _varint(int(v))
            else:
                data = v.encode() if isinstance(v, str) else bytes(v)
                out += _varint(number << 3 | 2) + _varint(len(data)) + data
    return bytes(out)


def decode(data):
    """{field number: [values]}: varints as int, length-delimited as bytes."""
    fields = {}
    i = 0

    def varint():
        nonlocal i
        n = shift = 0
        while True:
            b = data[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n

    while i < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            value = varint()
        elif wire == 2:
            n = varint()
            value = bytes(data[i:i + n])
            i += n
        elif wire == 1:
            value = data[i:i + 8]
            i += 8
        elif wire == 5:
            value = data[i:i + 4]
            i += 4
        else:
            raise ValueError(f"wire type {wire} in a peer message")
        fields.setdefault(number, []).append(value)
    return fields


# ------------------------------------------------------ peer.proto shapes ----

def manifest_file(path, size, mtime_ns=1_700_000_000_123_456_789, mode=0o644, generation=0):
    return message((1, path), (2, size), (3, mtime_ns), (4, mode), (7, generation))


def transfer_spec(source_export, source_path, dest_site, dest_export, dest_path, sources=(),
                  requested_by=None, keep_checkpoints=0, checkpoint_marker=""):
    """A TransferSpec (control.proto) naming a remote source."""
    return message((1, list(sources)), (2, dest_site), (3, dest_export), (4, dest_path),
                   (11, keep_checkpoints or None), (12, checkpoint_marker or None),
                   (21, source_export), (22, source_path), (23, requested_by))


def manifest(files, chunk_size=MIN_CHUNK_SIZE, empty_dirs=()):
    return message((1, list(files)), (2, chunk_size), (3, list(empty_dirs)))


def open_request(transfer_id, export, dest_path, manifest_bytes, commit_last=(), single_file=False,
                 keep_checkpoints=0, checkpoint_marker="", skip_unchanged=False, relay_by="",
                 relay_to=None, requested_by=""):
    """An OpenRequest; fan-out: `relay_by` a site, `relay_to` (site, transfer id);
    `requested_by` the site a pull or third-party copy is sent for."""
    return message((1, transfer_id), (3, export), (4, dest_path), (5, manifest_bytes),
                   (6, list(commit_last)), (7, skip_unchanged or None), (8, single_file or None),
                   (9, keep_checkpoints or None), (10, checkpoint_marker or None),
                   (13, relay_by or None),
                   (14, message((1, relay_to[0]), (2, relay_to[1])) if relay_to else None),
                   (15, requested_by or None))


class Answer:
    """A PeerMessage answer: its error (if any) and its body's fields."""

    def __init__(self, data):
        f = decode(data)
        self.request_id = f.get(1, [0])[0]
        self.error = f.get(20, [b""])[0].decode()
        self.error_code = f.get(22, [0])[0]
        self.retryable = bool(f.get(21, [0])[0])
        self.body_field = next((n for n in range(3, 20) if n in f), None)
        self.body = decode(f[self.body_field][0]) if self.body_field else {}

    def ok(self):
        return not self.error

    def __repr__(self):
        return f"Answer(error={self.error!r}, code={self.error_code}, body={self.body_field})"


# ------------------------------------------------------------- channels ----

def _frame(kind, payload, session=0):
    return struct.pack("<IBBHIIQ", MAGIC, 1, kind, 0, len(payload), 0, session) + payload


class Channel:
    """One TLS connection to the receiving daemon, after its HELLO."""

    def __init__(self, sock, transfer_id):
        self.sock = sock
        self.session = session_id(transfer_id)
        self.next_request = 1

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def _read_exactly(self, n):
        out = bytearray()
        while len(out) < n:
            data = self.sock.recv(n - len(out))
            if not data:
                raise ConnectionError("the daemon closed the connection")
            out += data
        return bytes(out)

    def read_frame(self):
        magic, _, kind, _, length, _, _ = struct.unpack("<IBBHIIQ", self._read_exactly(24))
        if magic != MAGIC:
            raise ValueError(f"bad magic {magic:#x} from the daemon")
        return kind, self._read_exactly(length)

    def call(self, field, body):
        """Sends a PeerMessage with `body` as field `field` (2 open, 4 commit,
        6 abort, 8 verify, 14 relay attach, 15 progress); returns the Answer."""
        request_id = self.next_request
        self.next_request += 1
        self.sock.sendall(_frame(CONTROL, message((1, request_id), (field, body)), self.session))
        kind, payload = self.read_frame()
        if kind != CONTROL:
            raise ValueError(f"expected a control answer, got frame type {kind}")
        return Answer(payload)

    def open(self, *args, **kwargs):
        return self.call(2, open_request(*args, **kwargs))

    def commit(self, transfer_id):
        return self.call(4, message((1, transfer_id)))

    def abort(self, transfer_id, reason="hostile"):
        return self.call(6, message((1, transfer_id), (2, reason)))

    def verify(self, transfer_id):
        return self.call(8, message((1, transfer_id)))

    def relay_attach(self, transfer_id, owner):
        """Fan-out: attaches as the relay of `transfer_id`, relaying it for
        `owner`, the site whose transfer it is (answered like an open)."""
        return self.call(14, message((1, transfer_id), (2, owner or None)))

    def progress(self, transfer_id, digests=()):
        """A ProgressRequest; fan-out: `digests` are (file_index, chunk_index,
        generation, chunk bytes) whose xxh3-128 the owner vouches for. The
        answer's body has 4: awaiting_digests (ChunkIds), 5: relay_refused."""
        vouched = [message((1, f or None), (2, c or None), (3, g or None),
                           (4, struct.pack("<QQ", *xxh128(data))))
                   for f, c, g, data in digests]
        return self.call(15, message((1, transfer_id), (2, vouched)))

    def remote_submit(self, request_id, spec):
        """A RemoteSubmitRequest (pull and third-party copy) with `spec`, a
        TransferSpec from transfer_spec(); returns the Answer."""
        return self.call(10, message((1, request_id), (2, spec)))

    def remote_get(self, transfer_id):
        return self.call(11, message((1, transfer_id)))

    def remote_cancel(self, transfer_id):
        return self.call(12, message((1, transfer_id)))

    def send_chunk(self, file_index, chunk_index, data, generation=0, digest=None):
        """Sends one chunk with its right digest (or `digest`, a (low, high)
        pair); returns (result, message) of its ack."""
        low, high = digest or xxh128(data)
        header = struct.pack("<IIIIQQ", file_index, chunk_index, generation, 0, low, high)
        self.sock.sendall(_frame(CHUNK, header + bytes(data), self.session))
        kind, payload = self.read_frame()
        if kind != CHUNK_ACK:
            raise ValueError(f"expected a chunk ack, got frame type {kind}")
        _, _, _, result = struct.unpack("<IIII", payload[:16])
        return result, payload[16:].decode(errors="replace")


class HostilePeer:
    """Dials `address` (host:port of the receiving daemon, named `server_site`
    in its certificate) as `site`, with `pki`/SITE.pem and .key."""

    def __init__(self, pki, site, address, server_site):
        self.pki = pki
        self.site = site
        self.host, port = address.rsplit(":", 1)
        self.port = int(port)
        self.server_site = server_site

    def connect(self, role, transfer_id, stream_index=0):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.load_verify_locations(os.path.join(self.pki, "ca.pem"))
        ctx.load_cert_chain(os.path.join(self.pki, self.site + ".pem"),
                            os.path.join(self.pki, self.site + ".key"))
        raw = socket.create_connection((self.host, self.port), timeout=30)
        sock = ctx.wrap_socket(raw, server_hostname=self.server_site)
        hello = message((1, role), (2, transfer_id), (3, stream_index or None), (4, PROTOCOL_VERSION))
        sock.sendall(_frame(HELLO, hello, session_id(transfer_id)))
        return Channel(sock, transfer_id)

    def control(self, transfer_id):
        return self.connect(ROLE_CONTROL, transfer_id)

    def remote(self):
        """A REMOTE channel: requests to the daemon's transfer manager as this site."""
        channel = self.connect(ROLE_REMOTE, "")
        channel.session = 0
        return channel

    def publish(self, transfer_id, export, dest_path, files, chunk_size=MIN_CHUNK_SIZE, **open_args):
        """Opens, sends every chunk and commits a transfer of `files`
        ({path: (bytes, mode)}, in that order; one file with
        single_file=True). Returns the first Answer that is an error, or
        the commit's answer."""
        paths = list(files)
        m = manifest([manifest_file(p, len(files[p][0]), mode=files[p][1]) for p in paths],
                     chunk_size=chunk_size)
        control = self.control(transfer_id)
        try:
            opened = control.open(transfer_id, export, dest_path, m, **open_args)
            if not opened.ok():
                return opened
            durable = {(decode(c).get(1, [0])[0], decode(c).get(2, [0])[0])
                       for c in opened.body.get(1, [])}
            data = self.connect(ROLE_DATA, transfer_id)
            try:
                for index, path in enumerate(paths):
                    content = files[path][0]
                    for c, offset in enumerate(range(0, len(content), chunk_size)):
                        if (index, c) in durable:
                            continue
                        result, why = data.send_chunk(index, c, content[offset:offset + chunk_size])
                        if result != ACK_DURABLE:
                            raise AssertionError(f"chunk {c} of {path} not durable: {result} {why}")
            finally:
                data.close()
            return control.commit(transfer_id)
        finally:
            control.close()

    def tls(self):
        """A TLS connection authenticated as `site` on which nothing was sent yet."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.load_verify_locations(os.path.join(self.pki, "ca.pem"))
        ctx.load_cert_chain(os.path.join(self.pki, self.site + ".pem"),
                            os.path.join(self.pki, self.site + ".key"))
        raw = socket.create_connection((self.host, self.port), timeout=30)
        return ctx.wrap_socket(raw, server_hostname=self.server_site)


def frame_header(kind, payload_length, session=0):
    """A frame header alone, declaring `payload_length` bytes that may never come."""
    return struct.pack("<IBBHIIQ", MAGIC, 1, kind, 0, payload_length, 0, session)


def chunk_header(file_index, chunk_index, generation=0, digest=(0, 0)):
    """The 32 bytes that lead a CHUNK payload."""
    return struct.pack("<IIIIQQ", file_index, chunk_index, generation, 0, *digest)


# ------------------------------------------------------- exchange frames ----
# daemon <-> daemon exchange messages (proto/longhaul/v1/exchange.proto,
# ExchangePeerMessage), on a channel opened with role EXCHANGE.

ROLE_EXCHANGE = 5
EX_JOIN, EX_REDUCE_DATA, EX_ABORT, EX_P2P, EX_LEAVE, EX_DISCARD, EX_DONE, EX_REFUSED = range(1, 9)
EX_FLOAT32, EX_SUM = 1, 1
EX_SEGMENT_BYTES = 4 << 20


def exchange_message(kind, group="", generation=None, members=(), seq=None, tag=None, dtype=None,
                     op=None, count=None, reason=None, msg_id=None, offset=None, total_bytes=None,
                     payload_bytes=None):
    """An ExchangePeerMessage, by field number."""
    return message((1, kind), (2, group or None), (3, generation), (4, list(members)), (5, seq),
                   (6, tag), (7, dtype), (8, op), (9, count), (11, payload_bytes), (12, reason),
                   (14, msg_id), (15, offset), (16, total_bytes))


def connect_exchange(peer):
    """An EXCHANGE channel of HostilePeer `peer` to its daemon."""
    return peer.connect(ROLE_EXCHANGE, "")


def send_exchange(channel, msg_id, kind, payload=b"", **fields):
    """Sends one exchange message (its payload, if any, as one segment of
    at most EX_SEGMENT_BYTES) on an EXCHANGE channel."""
    header = exchange_message(kind, msg_id=msg_id, offset=0, total_bytes=len(payload),
                              payload_bytes=len(payload), **fields)
    channel.sock.sendall(_frame(CONTROL, header) + bytes(payload))


def end_exchange(channel, timeout=60):
    """Sends a malformed segment, which makes the daemon close the channel,
    and waits for that: once it has, the daemon has read everything sent
    before. True if the daemon closed it."""
    channel.sock.sendall(_frame(CONTROL, exchange_message(
        EX_P2P, group="end", msg_id=1 << 62, total_bytes=1 << 50, payload_bytes=EX_SEGMENT_BYTES)))
    channel.sock.settimeout(timeout)
    try:
        while channel.sock.recv(4096):
            pass
        return True
    except (ConnectionError, ssl.SSLError):
        return True
    except socket.timeout:
        return False
