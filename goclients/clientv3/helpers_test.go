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

// waitRenewedPast waits for a keepalive answer more than ttl seconds after `since` (when `what` happened): the lease
// was renewed after it, or it would have expired and clientv3 would have closed the channel. The deadline is
// generous (an election on a loaded machine may take seconds): what fails is the channel closing or an answer that
// says the lease is gone, not the time it takes.
func waitRenewedPast(t testing.TB, kch <-chan *clientv3.LeaseKeepAliveResponse, since time.Time, ttl int64, what string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case ka, ok := <-kch:
			if !ok {
				t.Fatalf("the keepalive channel closed %v after %s", time.Since(since).Round(time.Millisecond), what)
			}
			if ka.TTL <= 0 {
				t.Fatalf("keepalive answer with TTL %d after %s", ka.TTL, what)
			}
			if time.Since(since) > time.Duration(ttl)*time.Second {
				t.Logf("keepalive answer %v after %s: TTL %d", time.Since(since).Round(time.Millisecond), what, ka.TTL)
				return
			}
		case <-deadline:
			t.Fatalf("no keepalive answer more than %d s after %s, within 30 s", ttl, what)
		}
	}
}
