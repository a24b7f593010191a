// Package clientv3 runs etcd's Go client v3.7 (go.etcd.io/etcd/client/v3) and its packages (naming/resolver,
// concurrency, leasing) against the target: etcd's members directly, or the proxy under each profile.
package clientv3

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"etcdproxy.test/goclients/harness"
)

// ctxFor is a context that ends after d or when the test ends.
func ctxFor(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond every 50 ms until it holds, failing the test with what after d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// peerClients are two clients of the same etcd through different front doors: through the proxy, one of the
// run's proxy and one of another proxy the test starts (with the profile's flags); directly, one of member 0 and
// one of member 1.
func peerClients(t testing.TB, env *harness.Env) (*clientv3.Client, *clientv3.Client) {
	t.Helper()
	if env.Proxied() {
		p := env.StartProxy(t)
		return env.Client(t), harness.NewClient(t, []string{p.Endpoint})
	}
	return harness.NewClient(t, env.Members[:1]), harness.NewClient(t, env.Members[1:2])
}

// mustPut puts key=val through kv and returns the revision of the write.
func mustPut(t testing.TB, kv clientv3.KV, key, val string) int64 {
	t.Helper()
	resp, err := kv.Put(ctxFor(t, 10*time.Second), key, val)
	if err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	return resp.Header.Revision
}

// getValue is key's value through kv ("" and false if it has none).
func getValue(t testing.TB, kv clientv3.KV, key string) (string, bool) {
	t.Helper()
	resp, err := kv.Get(ctxFor(t, 10*time.Second), key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if len(resp.Kvs) == 0 {
		return "", false
	}
	return string(resp.Kvs[0].Value), true
}
