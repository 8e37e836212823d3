#!/usr/bin/env python3
"""Writes the exchange_peer fuzz seeds (tests/fuzz/corpus/exchange_peer/).

Each seed is what a peer could send on an exchange link: CONTROL frames
(proto/FRAMES.md header) holding a longhaul.v1.ExchangePeerMessage, each
segment's frame followed by its payload bytes (proto/EXCHANGE.md). The
messages are written in protobuf text format and encoded with protoc.
Run from the repository root: tests/fuzz/seed_sources/exchange_peer/make_seeds.py
"""
import os
import struct
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus", "exchange_peer")


def encode(text):
    return subprocess.run(
        ["protoc", "--encode=longhaul.v1.ExchangePeerMessage", "-I", os.path.join(ROOT, "proto"),
         os.path.join(ROOT, "proto", "longhaul", "v1", "exchange.proto")],
        input=text.encode(), stdout=subprocess.PIPE, check=True).stdout


def frame(text, payload=b""):
    body = encode(text)
    header = struct.pack("<IBBHIIQ", 0x4D46484C, 1, 2, 0, len(body), 0, 0)
    return header + body + payload


def seg(kind, msg_id, offset, n, total, extra=""):
    return frame(f"kind: {kind} group: 'g' msg_id: {msg_id} offset: {offset} "
                 f"payload_bytes: {n} total_bytes: {total} {extra}", bytes([msg_id % 251]) * n)


SEEDS = {
    "join": frame("kind: JOIN group: 'g' generation: 1 members: 'site-a' members: 'site-b' "
                  "join_nonce: 7 msg_id: 1"),
    "done_abort": frame("kind: DONE group: 'g' generation: 1 seq: 3 msg_id: 2")
                  + frame("kind: ABORT group: 'g' generation: 1 seq: 4 reason: 'timeout' msg_id: 3"),
    "refused": frame("kind: REFUSED msg_id: 4 refused_msg_id: 9 reason: 'limit'"),
    "p2p_small": seg("P2P", 5, 0, 13, 13, "tag: 't'"),
    "p2p_two_segments": seg("P2P", 6, 0, 100, 150, "tag: 't'")
                        + seg("P2P", 6, 100, 50, 150, "tag: 't'"),
    "reduce_data": seg("REDUCE_DATA", 7, 0, 64, 64,
                       "generation: 1 seq: 1 dtype: FLOAT32 op: SUM count: 16"),
    "reduce_shard": seg("REDUCE_DATA", 19, 0, 4000, 4000,
                        "generation: 1 seq: 1 dtype: FLOAT32 op: SUM count: 3001 shards: 3 shard: 1"),
    "reduce_result": seg("REDUCE_RESULT", 20, 0, 4000, 4000,
                         "generation: 1 seq: 1 dtype: FLOAT32 op: SUM count: 3001 shards: 3 "
                         "shard: 1"),
    "reduce_result_empty_shard": frame("kind: REDUCE_RESULT group: 'g' generation: 1 seq: 1 "
                                       "dtype: FLOAT32 op: SUM count: 2 shards: 3 shard: 1 "
                                       "msg_id: 21"),
    "reduce_shard_wrong": seg("REDUCE_DATA", 22, 0, 4004, 4004,
                              "generation: 1 seq: 1 dtype: FLOAT32 op: SUM count: 3001 shards: 3 "
                              "shard: 4000000000")
                          + seg("REDUCE_RESULT", 23, 0, 8, 8,
                                "generation: 1 count: 18446744073709551615 shards: 4294967295 "
                                "shard: 7"),
    "gather_data": seg("GATHER_DATA", 24, 0, 4096, 4096, "generation: 1 seq: 2 count: 4096"),
    "gather_data_wrong": seg("GATHER_DATA", 25, 0, 64, 64, "generation: 1 seq: 2 count: 4096")
                         + seg("GATHER_DATA", 26, 0, 8, 8,
                               "generation: 2 seq: 2 tag: 'x' count: 18446744073709551615"),
    "bcast_data": seg("BCAST_DATA", 27, 0, 4096, 4096,
                      "generation: 1 seq: 3 count: 4096 root: 'site-b'")
                  + frame("kind: DONE group: 'g' generation: 1 seq: 3 msg_id: 28"),
    "bcast_data_other_root": seg("BCAST_DATA", 29, 0, 4096, 4096,
                                 "generation: 1 seq: 3 count: 4096 root: 'site-a'"),
    "interleaved": seg("P2P", 8, 0, 10, 20, "tag: 'a'") + seg("P2P", 9, 0, 5, 5, "tag: 'b'")
                   + seg("P2P", 8, 10, 10, 20, "tag: 'a'"),
    "discard": seg("P2P", 10, 0, 32, 64, "tag: 't'") + frame("kind: DISCARD msg_id: 10")
               + seg("P2P", 10, 0, 8, 8, "tag: 't'"),
    "ends_mid_message": seg("P2P", 11, 0, 32, 64, "tag: 't'"),
    "ends_mid_payload": seg("P2P", 12, 0, 32, 32, "tag: 't'")[:-5],
    "out_of_order": seg("P2P", 13, 0, 8, 24, "tag: 't'") + seg("P2P", 13, 16, 8, 24, "tag: 't'"),
    "never_started": seg("P2P", 14, 8, 8, 16, "tag: 't'"),
    "oversized": frame("kind: P2P group: 'g' tag: 't' msg_id: 15 payload_bytes: 4194304 "
                       "total_bytes: 1099511627776"),
    "segment_too_large": frame("kind: P2P group: 'g' tag: 't' msg_id: 16 payload_bytes: 4194305 "
                               "total_bytes: 8388608"),
    "empty_segment": frame("kind: P2P group: 'g' tag: 't' msg_id: 17 payload_bytes: 0 "
                           "total_bytes: 8"),
    "total_changes": seg("P2P", 18, 0, 8, 16, "tag: 't'") + seg("P2P", 18, 8, 8, 24, "tag: 't'"),
    "wrong_frame_type": frame("kind: JOIN group: 'g'")[:5] + b"\x01" + frame("kind: JOIN")[6:],
    "malformed_proto": struct.pack("<IBBHIIQ", 0x4D46484C, 1, 2, 0, 3, 0, 0) + b"\xff\xff\xff",
}

os.makedirs(OUT, exist_ok=True)
for name, data in SEEDS.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
print(f"wrote {len(SEEDS)} seeds to {OUT}")
