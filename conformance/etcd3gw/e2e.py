"""OpenStack's etcd3gw (a client of etcd's HTTP/JSON gateway) end to end against one endpoint: KV, watch, leases
and locks, as tooz and other OpenStack services use them. Run by conformance/tests/etcd3gw.rs against direct etcd
and through the proxy.

Usage: e2e.py HOST PORT PREFIX. Prints `ok <check>` per check passed; on the first failure prints `FAILED <check>:
<why>` and exits 1. Every wait has a deadline; the last line on success is `all checks passed`.
"""

import sys
import threading
import uuid

from etcd3gw.client import Etcd3Client

DEADLINE_SECONDS = 30


class Failed(Exception):
    pass


def check(name, condition, detail=""):
    if not condition:
        raise Failed(f"{name}: {detail}")
    print(f"ok {name}", flush=True)


def kv(client, prefix):
    a, b = prefix + "kv/a", prefix + "kv/b"
    check("put returns true", client.put(a, "1") is True)
    client.put(b, "2")
    got = client.get(a)
    check("get reads the value put", got == [b"1"], repr(got))
    values = sorted(v for v, _ in client.get_prefix(prefix + "kv/"))
    check("get_prefix reads both keys", values == [b"1", b"2"], repr(values))
    check("create of an existing key is refused", client.create(a, "x") is False)
    check("delete of a key returns true", client.delete(a) is True)
    check("a deleted key reads as nothing", client.get(a) == [], repr(client.get(a)))
    check("delete of a missing key returns false", client.delete(a) is False)
    check("status names the server's version", "version" in client.status(), repr(client.status()))
    check("members lists one member", len(client.members()) == 1, repr(client.members()))


def watch(client, other, prefix):
    key = prefix + "watch/k"
    events, cancel = client.watch(key)
    # The watch is created on etcd once its answer's head came back: a put from the other client after it is seen.
    other.put(key, "v1")
    # The iterator blocks without a deadline of its own: it is read in a thread, waited for with one.
    first = []
    reader = threading.Thread(target=lambda: first.append(next(events, None)), daemon=True)
    reader.start()
    reader.join(DEADLINE_SECONDS)
    seen = first[0] if first else None
    check("a watch sees another client's put", seen is not None, f"nothing within {DEADLINE_SECONDS} s")
    kv = seen["kv"]
    check("the event carries the key and value", kv["key"] == key.encode() and kv["value"] == b"v1", repr(kv))
    cancel()
    print("ok the watch is canceled", flush=True)


def leases(client, prefix):
    key = prefix + "lease/k"
    lease = client.lease(ttl=60)
    check("a lease is granted with an ID", lease.id > 0, repr(lease.id))
    check("refresh keeps it alive with its TTL", lease.refresh() == 60)
    client.put(key, "held", lease=lease)
    keys = lease.keys()
    check("the lease lists its key", keys == [key.encode()], repr(keys))
    check("ttl reads the time left", 0 < lease.ttl() <= 60, repr(lease.ttl()))
    check("revoke returns true", lease.revoke() is True)
    check("the key goes with its lease", client.get(key) == [], repr(client.get(key)))


def locks(client, other, prefix):
    name = prefix + "lock-" + uuid.uuid4().hex
    first = client.lock(name, ttl=60)
    second = other.lock(name, ttl=60)
    check("the first lock is acquired", first.acquire() is True)
    check("it is held", first.is_acquired() is True)
    check("a second lock of the name waits (is not acquired)", second.acquire() is False)
    check("the first is released", first.release() is True)
    check("then the second is acquired", second.acquire() is True)
    check("and released", second.release() is True)


def main():
    host, port, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    # No api_path: etcd3gw asks GET /version which API path the server has, as users' clients do.
    client = Etcd3Client(host=host, port=port, timeout=DEADLINE_SECONDS)
    other = Etcd3Client(host=host, port=port, timeout=DEADLINE_SECONDS)
    try:
        kv(client, prefix)
        watch(client, other, prefix)
        leases(client, prefix)
        locks(client, other, prefix)
    except Failed as e:
        print(f"FAILED {e}", flush=True)
        return 1
    except Exception as e:  # an exception of the client is a failed check too, with its text
        print(f"FAILED {type(e).__name__}: {e}", flush=True)
        return 1
    print("all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
