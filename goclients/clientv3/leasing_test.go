package clientv3

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/client/v3/leasing"

	"etcdproxy.test/goclients/harness"
)

// TestLeasingKV: two leasing KVs on different proxies (directly: members) share keys. Each read acquires a
// leasing key (<leases>/<key>, under the reader's session lease) and is then served from the reader's cache; a
// write by the other revokes that lease (the owner deletes its leasing key when it sees the REVOKE the writer
// puts), so every cached read stays correct across puts, deletes and Txns. Revoking a leasing KV's session lease
// deletes its leasing keys, and it reads afresh.
func TestLeasingKV(t *testing.T) {
	env := harness.Get(t)
	a, b := peerClients(t, env)
	pfx := env.Prefix(t)
	leases := pfx + "leases/"
	lka, closeA, err := leasing.NewKV(a, leases, concurrency.WithTTL(10))
	if err != nil {
		t.Fatalf("leasing KV a: %v", err)
	}
	defer closeA()
	lkb, closeB, err := leasing.NewKV(b, leases, concurrency.WithTTL(10))
	if err != nil {
		t.Fatalf("leasing KV b: %v", err)
	}
	defer closeB()
	key := pfx + "data/k"
	leaseKey := leases + key
	// leaseOf is the lease holding key's leasing key, read through the plain client a (0: no leasing key).
	leaseOf := func() (clientv3.LeaseID, bool) {
		t.Helper()
		resp, err := a.Get(ctxFor(t, 10*time.Second), leaseKey)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return 0, false
		}
		return clientv3.LeaseID(resp.Kvs[0].Lease), true
	}
	expect := func(kv clientv3.KV, who, want string, present bool) {
		t.Helper()
		v, ok := getValue(t, kv, key)
		if v != want || ok != present {
			t.Fatalf("%s reads %q (present %v), want %q (present %v)", who, v, ok, want, present)
		}
	}

	mustPut(t, lka, key, "1")
	expect(lkb, "b", "1", true)
	if id, ok := leaseOf(); !ok || id == 0 {
		t.Fatalf("after b's read no leasing key holds %s under a lease (%v %x)", key, ok, id)
	}
	bLease, _ := leaseOf()
	expect(lkb, "b (cached)", "1", true)
	expect(lka, "a", "1", true)

	// a's put must revoke b's lease before it writes; b's next read is the new value.
	mustPut(t, lka, key, "2")
	if id, ok := leaseOf(); ok && id == bLease {
		t.Fatalf("a's put left b's leasing key under b's lease %x", id)
	}
	expect(lkb, "b after a's put", "2", true)
	expect(lka, "a after its put", "2", true)

	// A read by b again takes the lease; b deletes; a (which may hold it now) sees the delete.
	expect(lkb, "b", "2", true)
	expect(lka, "a", "2", true)
	if _, err := lkb.Delete(ctxFor(t, 10*time.Second), key); err != nil {
		t.Fatalf("b deletes: %v", err)
	}
	expect(lka, "a after b's delete", "", false)
	expect(lkb, "b after its delete", "", false)

	// Txn through b on a value a has cached.
	mustPut(t, lka, key, "3")
	expect(lka, "a", "3", true)
	resp, err := lkb.Txn(ctxFor(t, 10*time.Second)).
		If(clientv3.Compare(clientv3.Value(key), "=", "3")).
		Then(clientv3.OpPut(key, "4")).Else(clientv3.OpPut(key, "wrong")).Commit()
	if err != nil || !resp.Succeeded {
		t.Fatalf("b's txn on value 3: %v %v", resp, err)
	}
	expect(lka, "a after b's txn", "4", true)
	resp, err = lka.Txn(ctxFor(t, 10*time.Second)).
		If(clientv3.Compare(clientv3.Value(key), "=", "3")).
		Then(clientv3.OpPut(key, "wrong")).Else(clientv3.OpGet(key)).Commit()
	if err != nil || resp.Succeeded {
		t.Fatalf("a's txn on stale value 3: %v %v", resp, err)
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) != 1 || string(kvs[0].Value) != "4" {
		t.Fatalf("a's txn else-get: %v, want 4", kvs)
	}
	// The plain client agrees with both.
	if v, _ := getValue(t, a, key); v != "4" {
		t.Fatalf("plain read %q, want 4", v)
	}

	// Revoking a's session lease (through the plain client) deletes its leasing key; a notices (its watch of the
	// leasing key, its session's end) and drops its cached value: after b's put a reads b's value.
	// An owner whose lease was revoked does not take one again for a while (the leasing KV's revoke backoff, 2 s):
	// a reads until it holds the leasing key again.
	waitFor(t, 10*time.Second, "a holds the leasing key again", func() bool {
		expect(lka, "a", "4", true)
		id, ok := leaseOf()
		return ok && id != 0
	})
	held, _ := leaseOf()
	if _, err := a.Revoke(ctxFor(t, 10*time.Second), held); err != nil {
		t.Fatalf("revoke a's session lease %x: %v", held, err)
	}
	if id, ok := leaseOf(); ok && id == held {
		t.Fatalf("a's leasing key still under the revoked lease %x", held)
	}
	mustPut(t, lkb, key, "5")
	expect(lkb, "b", "5", true)
	if v, _ := getValue(t, a, key); v != "5" {
		t.Fatalf("plain read %q, want 5", v)
	}
	waitFor(t, 10*time.Second, "a reads b's put after its lease was revoked", func() bool {
		v, _ := getValue(t, lka, key)
		return v == "5"
	})
	mustPut(t, lka, key, "6")
	expect(lkb, "b", "6", true)
}
