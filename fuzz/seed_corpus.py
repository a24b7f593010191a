#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target (fuzz/corpus/<target>/) from hand-made valid inputs: protobuf
messages of etcd's API (encoded here field by field, field numbers from proto/proto/), HTTP/2 frames,
paths and command lines. Run once from fuzz/; the corpus is committed. Inputs follow each target's layout, described
at the top of fuzz_targets/<target>.rs."""
import os
import struct


def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def v(number, value):  # varint field
    return varint(number << 3) + varint(value)


def b(number, data):  # length-delimited field
    if isinstance(data, str):
        data = data.encode()
    return varint(number << 3 | 2) + varint(len(data)) + data


def write(target, name, data):
    directory = os.path.join("corpus", target)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)


# etcdserverpb messages.
def range_request(key, end=b"", **fields):
    out = b(1, key) if key else b""
    out += b(2, end) if end else b""
    numbers = dict(limit=3, revision=4, sort_order=5, sort_target=6, serializable=7, count_only=9,
                   min_mod_revision=10, max_create_revision=13)
    for name, value in fields.items():
        out += v(numbers[name], value)
    return out


def put_request(key, value=b"v"):
    return b(1, key) + b(2, value)


def op(kind, message):  # RequestOp: range 1, put 2, delete 3, txn 4
    return b(kind, message)


def txn(compare=(), success=(), failure=()):
    return b"".join([b(1, c) for c in compare] + [b(2, s) for s in success] + [b(3, f) for f in failure])


def compare(key, end=b""):  # result EQUAL, target VALUE, value "x"
    return v(2, 3) + b(3, key) + b(7, b"x") + (b(64, end) if end else b"")


def kv(key, value=b"v"):
    return b(1, key) + v(2, 5) + v(3, 6) + v(4, 1) + b(5, value)


def header():
    return v(1, 14841639068965178418) + v(2, 10276657743932975437) + v(3, 42) + v(4, 3)


reads = txn([compare(b"c")], [op(1, range_request(b"a", b"b")), op(1, range_request(b"z"))],
            [op(1, range_request(b"a", b"\0", limit=10))])
writes = txn([compare(b"c")], [op(2, put_request(b"k"))], [op(3, range_request(b"d", b"e"))])
nested = txn(success=[op(4, txn(success=[op(1, range_request(b"n"))], failure=[op(4, txn(success=[op(2, put_request(b"w"))]))]))])

# (a) wire
write("wire", "put", put_request(b"key", b"value") + v(3, 300) + v(4, 1))
write("wire", "range", range_request(b"a", b"b", limit=5, revision=(1 << 64) - 1))
write("wire", "txn", nested)
write("wire", "fixed_widths", bytes([0x79, 1, 0, 0, 0, 0, 0, 0, 0, 0x85, 0x01, 2, 0, 0, 0]))
write("wire", "long_key", b(1, b"k" * 200) + v(99, 42))

# (b) methods
write("methods", "txn_reads", reads)
write("methods", "txn_writes", writes)
write("methods", "txn_nested", nested)
write("methods", "txn_nested_reads", txn(success=[op(4, txn(success=[op(1, range_request(b"n"))]))]))
write("methods", "alarm_get", b"")
write("methods", "alarm_activate", v(1, 1) + v(2, 7) + v(3, 1))
write("methods", "alarm_get_member", v(1, 0) + v(2, 7))

# (c) namespace: [schema][prefix length][prefix][message]; schemas in fuzz_targets/namespace.rs's order.
RANGE_REQ, RANGE_RESP, RANGE_STREAM_RESP, PUT_REQ, PUT_RESP, DELETE_RESP, TXN_REQ, TXN_RESP, LEASE_TTL_RESP, \
    GRANT_REQ, REVOKE_REQ, ROLE_GET_RESP, NAME_FIRST, LOCK_RESP, CAMPAIGN_RESP, PROCLAIM_REQ, LEADER_RESP = range(17)


def ns(schema, message, prefix=b"/app/"):
    return bytes([schema, len(prefix)]) + prefix + message


def perm(key, end=b""):
    return v(1, 1) + b(2, key) + (b(3, end) if end else b"")


write("namespace", "range_request", ns(RANGE_REQ, range_request(b"a", b"\0", limit=5)))
write("namespace", "range_response", ns(RANGE_RESP, b(1, header()) + b(2, kv(b"/app/a")) + b(2, kv(b"/app/b")) + v(4, 2)))
write("namespace", "range_stream_response", ns(RANGE_STREAM_RESP, b(1, b(2, kv(b"/app/x")) + v(4, 1))))
write("namespace", "put_request", ns(PUT_REQ, put_request(b"k"), prefix=b"a\xff"))
write("namespace", "delete_response", ns(DELETE_RESP, b(1, header()) + v(2, 1) + b(3, kv(b"/app/d"))))
write("namespace", "txn_request", ns(TXN_REQ, reads))
write("namespace", "txn_request_nested", ns(TXN_REQ, nested, prefix=b"\xff"))
write("namespace", "txn_response", ns(TXN_RESP, b(1, header()) + v(2, 1) + b(3, b(1, b(2, kv(b"/app/t")))) + b(3, b(4, b(3, b(1, b(2, kv(b"/app/u"))))))))
write("namespace", "lease_ttl_response", ns(LEASE_TTL_RESP, v(2, 7) + v(3, 60) + b(5, b"/app/a") + b(5, b"/other/b")))
write("namespace", "grant_request", ns(GRANT_REQ, b(1, b"role") + b(2, perm(b"k", b"\0"))))
write("namespace", "revoke_request", ns(REVOKE_REQ, b(1, b"role") + b(2, b"k") + b(3, b"l")))
write("namespace", "role_get_response", ns(ROLE_GET_RESP, b(2, perm(b"/app/a")) + b(2, perm(b"/other")) + b(2, perm(b"/app/p", b"/app0"))))
write("namespace", "lock_request", ns(NAME_FIRST, b(1, b"lock") + v(2, 9)))
write("namespace", "lock_response", ns(LOCK_RESP, b(2, b"/app/lock/694d")))
write("namespace", "campaign_response", ns(CAMPAIGN_RESP, b(2, b(1, b"/app/e") + b(2, b"/app/e/694d") + v(3, 3) + v(4, 4))))
write("namespace", "proclaim_request", ns(PROCLAIM_REQ, b(1, b(1, b"e") + b(2, b"e/694d") + v(3, 3)) + b(2, b"v")))
write("namespace", "leader_response", ns(LEADER_RESP, b(2, kv(b"/app/e/694d"))))
write("namespace", "watch_create", ns(RANGE_REQ, b(1, b"w") + b(2, b"\0") + v(4, 1)))

# (d) range_stream
write("range_stream", "plain", range_request(b"a", b"\0", limit=100, revision=5))
write("range_stream", "descending", range_request(b"a", sort_order=2, sort_target=0))
write("range_stream", "filtered", range_request(b"a", b"b", max_create_revision=3, count_only=1))
write("range_stream", "no_key", range_request(b"", b"\0"))
write("range_stream", "chunk_numbers", struct.pack("<qQQ", 10, 100, 1 << 20) + range_request(b"k", sort_order=1))


# (e) frames
def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


HEADERS, DATA, PING, RST, SETTINGS = 1, 0, 6, 3, 4
ping = frame(PING, 0, 0, bytes(8))
traffic = frame(SETTINGS, 0, 0) + frame(HEADERS, 4, 1, b"\x83\x86") + frame(DATA, 1, 1, bytes(20)) + ping + frame(RST, 0, 1, bytes(4))
write("frames", "follow_split", bytes([0, 3, 1, 7, 0]) + traffic)
write("frames", "follow_whole", bytes([0, 0]) + traffic)
# The guard: mode (min time / 10 ms) << 1 | 1; steps: op, length, bytes (op % 4: 0/1 client (1 adds the preface),
# 2 server, 3 wait of length * 5 ms); op >> 2 is the read size - 1 of client steps.
flood = frame(HEADERS, 4, 1) + ping * 4
write("frames", "guard_flood", bytes([10 << 1 | 1, 1 | 16 << 2, len(flood)]) + flood)
calm = bytes([1, 9]) + frame(HEADERS, 4, 1) + bytes([2, 9]) + frame(HEADERS, 4, 1)
for _ in range(5):
    calm += bytes([0 | 3 << 2, 17]) + ping + bytes([3, 40])
write("frames", "guard_calm", bytes([10 << 1 | 1]) + calm)
server_data = frame(DATA, 0, 1, bytes(30))
mid = bytes([1, 9]) + frame(HEADERS, 4, 1) + bytes([2, 20]) + server_data[:20] + bytes([0, 68]) + ping * 4
write("frames", "guard_mid_frame", bytes([10 << 1 | 1]) + mid)
write("frames", "guard_http1", bytes([10 << 1 | 1, 0, 24]) + b"GET /health HTTP/1.1\r\n\r\n")
write("frames", "guard_off", bytes([1, 1, 17]) + ping + bytes([2, 17]) + ping)

# (f) routing
for name, path in [("range", "/etcdserverpb.KV/Range"), ("txn", "/etcdserverpb.KV/Txn"),
                   ("alarm", "/etcdserverpb.Maintenance/Alarm"), ("watch", "/etcdserverpb.Watch/Watch"),
                   ("observe", "/v3electionpb.Election/Observe"), ("unknown_method", "/etcdserverpb.KV/Scan"),
                   ("unknown_service", "/foo.Bar/Baz?x=1"), ("malformed", "nothing")]:
    write("routing", name, path.encode())

# (g) cli: [mode][arguments separated by NUL]; mode bit 0 puts `start` first.
for name, mode, args in [
    ("endpoints", 1, ["--endpoints=127.0.0.1:2379,http://10.0.0.2:2379", "--listen-addr", "0.0.0.0:23790", "--debug"]),
    ("limits", 1, ["--max-send-bytes=1024", "--max-recv-bytes", "2048", "--dial-timeout=1.5s", "--grpc-keepalive-min-time=5s"]),
    ("namespace_user", 1, ["--namespace=/app/", "--user=root:secret", "--watch-buffer-size=10"]),
    ("srv", 1, ["--discovery-srv=example.com", "--discovery-srv-name=x", "--insecure-discovery"]),
    ("unsupported", 1, ["--resolver-ttl=30", "--cacert=ca.pem", "--cert=c.pem", "--key=k.pem"]),
    ("help", 0, ["start", "--help"]),
    ("durations", 1, ["--dial-keepalive-time=2h45m", "--endpoints-auto-sync-interval=300ms"]),
]:
    write("cli", name, bytes([mode]) + b"\0".join(a.encode() for a in args))

# (h) gateway: [route index into proxy::gateway::routes::ROUTES][JSON body, or answer bytes]
for name, index, body in [
    ("range", 0, '{"key":"Zm9v","range_end":"Zm9w","limit":"10","sort_order":"DESCEND","serializable":true}'),
    ("put", 1, '{"key":"Zm9v","value":"YmFy","lease":"7587862372355556234","prev_kv":true}'),
    ("txn", 3, '{"compare":[{"key":"Zm9v","target":"VALUE","result":"EQUAL","value":"YmFy"}],'
               '"success":[{"request_put":{"key":"Zm9v","value":"YmF6"}}],'
               '"failure":[{"request_txn":{"success":[{"request_range":{"key":"Zm9v"}}]}}]}'),
    ("watch", 5, '{"create_request":{"key":"Zm9v","start_revision":"3","filters":["NOPUT"],"progress_notify":true}}'),
    ("lease_grant", 6, '{"TTL":60,"ID":"0"}'),
    ("empty", 0, ''),
    ("cut", 0, '{"key":'),
    ("answer_range", 0, b(1, v(1, 1) + v(3, 5)).decode("latin-1") + b(2, b(1, "foo") + v(2, 3) + b(5, "bar")).decode("latin-1")),
]:
    write("gateway", name, bytes([index]) + body.encode("latin-1"))
