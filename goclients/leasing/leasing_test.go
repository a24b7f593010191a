// Package leasing runs etcd's Go leasing client (go.etcd.io/etcd/client/v3/leasing, connected to etcd's members
// directly) and the proxy started with --experimental-leasing-prefix on the same prefix side by side: each
// revokes the other's ownership of a key when it writes it, and each reads the other's writes at once. Under a
// profile with a namespace, the Go client works inside that namespace too (as etcd's Go proxy wraps its leasing KV
// around its namespaced KV), so that both share the keys and the ownership keys.
package leasing

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/client/v3/leasing"
	"go.etcd.io/etcd/client/v3/namespace"

	"etcdproxy.test/goclients/harness"
)

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

func put(t testing.TB, kv clientv3.KV, key, val string) {
	t.Helper()
	if _, err := kv.Put(ctxFor(t, 10*time.Second), key, val); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

func get(t testing.TB, kv clientv3.KV, key string) (string, bool) {
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

// namespaced is a client of etcd's members that sees the run's namespace as its whole keyspace (KV, Watch and
// Lease, as etcd's Go proxy wraps them).
func namespaced(t testing.TB, env *harness.Env) *clientv3.Client {
	t.Helper()
	c := env.MemberClient(t)
	if ns := env.Namespace; ns != "" {
		c.KV = namespace.NewKV(c.KV, ns)
		c.Watcher = namespace.NewWatcher(c.Watcher, ns)
		c.Lease = namespace.NewLease(c.Lease, ns)
	}
	return c
}

// localReads is the proxy's etcd_grpc_proxy_leasing_local_reads_total (its own metrics are on /proxy/metrics;
// /metrics relays etcd's).
func localReads(t testing.TB, p *harness.Proxy) float64 {
	t.Helper()
	addr := p.Endpoint
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	req, err := http.NewRequestWithContext(ctxFor(t, 10*time.Second), "GET", addr+"/proxy/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /proxy/metrics: %v", err)
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(text), "\n") {
		if v, ok := strings.CutPrefix(line, "etcd_grpc_proxy_leasing_local_reads_total "); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("metric %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("no etcd_grpc_proxy_leasing_local_reads_total in the proxy's metrics")
	return 0
}

func TestProxyAndGoLeasingClientsRevokeEachOtherAndSeeEachOthersWrites(t *testing.T) {
	env := harness.Get(t)
	pfx := env.Prefix(t)
	leases := pfx + "leases/"
	proxy := env.StartProxy(t, "--experimental-leasing-prefix="+leases)
	through := harness.NewClient(t, []string{proxy.Endpoint})
	plain := namespaced(t, env)
	goKV, closeGo, err := leasing.NewKV(namespaced(t, env), leases, concurrency.WithTTL(10))
	if err != nil {
		t.Fatalf("Go's leasing KV: %v", err)
	}
	defer closeGo()

	owned := func(key string) bool {
		t.Helper()
		resp, err := plain.Get(ctxFor(t, 10*time.Second), leases+key)
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Kvs) == 1 && resp.Kvs[0].Lease != 0
	}
	// proxyOwns reads key through the proxy until the proxy answers it locally, checking the value each time.
	proxyOwns := func(key, want string) {
		t.Helper()
		waitFor(t, 10*time.Second, "the proxy answers "+key+" locally", func() bool {
			before := localReads(t, proxy)
			if v, _ := get(t, through, key); v != want {
				t.Fatalf("the proxy reads %s = %q, want %q", key, v, want)
			}
			return localReads(t, proxy) > before
		})
		if !owned(key) {
			t.Fatalf("the proxy answers %s locally without an ownership key", key)
		}
	}
	expect := func(kv clientv3.KV, who, key, want string, present bool) {
		t.Helper()
		if v, ok := get(t, kv, key); v != want || ok != present {
			t.Fatalf("%s reads %s = %q (present %v), want %q (present %v)", who, key, v, ok, want, present)
		}
	}

	// A Go leasing client's put revokes the proxy's ownership: the proxy's next read is the new value.
	k1 := pfx + "data/1"
	put(t, goKV, k1, "a")
	proxyOwns(k1, "a")
	put(t, goKV, k1, "b")
	expect(through, "the proxy after Go's put", k1, "b", true)

	// The proxy's put (a plain client through it) revokes the Go client's ownership, and so does its range delete.
	k2 := pfx + "data/2"
	put(t, through, k2, "a")
	expect(goKV, "Go", k2, "a", true)
	if !owned(k2) {
		t.Fatalf("Go's read of %s took no ownership", k2)
	}
	put(t, through, k2, "b")
	expect(goKV, "Go after the proxy's put", k2, "b", true)
	k3 := pfx + "data/3"
	put(t, through, k3, "a")
	expect(goKV, "Go", k3, "a", true)
	if _, err := through.Delete(ctxFor(t, 10*time.Second), pfx+"data/3", clientv3.WithPrefix()); err != nil {
		t.Fatalf("delete through the proxy: %v", err)
	}
	expect(goKV, "Go after the proxy's delete", k3, "", false)

	// A Go leasing client's Txn on a key the proxy owns revokes it too.
	k4 := pfx + "data/4"
	put(t, through, k4, "a")
	proxyOwns(k4, "a")
	resp, err := goKV.Txn(ctxFor(t, 10*time.Second)).
		If(clientv3.Compare(clientv3.Value(k4), "=", "a")).
		Then(clientv3.OpPut(k4, "b")).Commit()
	if err != nil || !resp.Succeeded {
		t.Fatalf("Go's txn on %s: %v %v", k4, resp, err)
	}
	expect(through, "the proxy after Go's txn", k4, "b", true)

	// A client that knows nothing of leasing, writing on etcd directly, revokes nothing; the proxy still sees its
	// write (it watches the keys it owns), unlike Go's leasing client.
	k5 := pfx + "data/5"
	put(t, plain, k5, "a")
	proxyOwns(k5, "a")
	put(t, plain, k5, "b")
	waitFor(t, 10*time.Second, "the proxy reads the plain write", func() bool {
		v, _ := get(t, through, k5)
		return v == "b"
	})
}
