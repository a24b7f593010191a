package clientv3

import (
	"context"
	"fmt"
	"math/rand"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/naming/resolver"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"etcdproxy.test/goclients/harness"
)

// registered is the addresses registered under prefix (keys prefix/<addr>), as the target's client sees them:
// the proxy registers inside its --namespace, which the target's client sees as its whole keyspace.
func registered(t testing.TB, c *clientv3.Client, prefix string) map[string]bool {
	t.Helper()
	resp, err := c.Get(ctxFor(t, 10*time.Second), prefix+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("get %s/: %v", prefix, err)
	}
	out := map[string]bool{}
	for _, kv := range resp.Kvs {
		out[strings.TrimPrefix(string(kv.Key), prefix+"/")] = true
	}
	return out
}

// TestResolverFollowsProxies dials `etcd:///<prefix>` (etcd's gRPC naming resolver) over proxies registered with
// --resolver-prefix: calls keep working when a proxy is killed (its registration goes within its TTL) and reach a
// proxy registered later (after the first two are killed, only the third can answer). clientv3.New does not take
// an `etcd:///` endpoint (its own resolver dials endpoints as addresses), so the clientv3 KV and Watch are built
// on the resolved gRPC connection.
func TestResolverFollowsProxies(t *testing.T) {
	env := harness.Get(t)
	if !env.Proxied() {
		t.Skip("registration under --resolver-prefix is the proxy's: etcd registers nothing")
	}
	prefix := fmt.Sprintf("goclients-resolver-%s-%d", env.Name(), rand.Int63())
	flags := []string{"--resolver-prefix=" + prefix, "--resolver-ttl=2"}
	p1 := env.StartProxy(t, flags...)
	p2 := env.StartProxy(t, flags...)
	c := env.Client(t)
	waitFor(t, 10*time.Second, "p1 and p2 registered", func() bool {
		r := registered(t, c, prefix)
		return r[p1.Endpoint] && r[p2.Endpoint]
	})

	b, err := resolver.NewBuilder(c)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("etcd:///"+prefix, grpc.WithResolvers(b),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(serviceConfig))
	if err != nil {
		t.Fatalf("dial etcd:///%s: %v", prefix, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	kv := clientv3.NewKVFromKVClient(pb.NewKVClient(conn), nil)
	key := env.Prefix(t) + "k"

	// put does n puts through the resolved connection.
	put := func(n int, what string) {
		t.Helper()
		for i := 0; i < n; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := kv.Do(ctx, clientv3.OpPut(key, fmt.Sprintf("%s-%d", what, i)))
			cancel()
			if err != nil {
				t.Fatalf("%s: put %d through etcd:///%s: %v", what, i, prefix, err)
			}
		}
	}
	put(10, "both")

	p1.Kill(t)
	put(20, "p1-killed")
	waitFor(t, 10*time.Second, "p1's registration gone within its TTL", func() bool {
		r := registered(t, c, prefix)
		return !r[p1.Endpoint] && r[p2.Endpoint]
	})
	put(10, "p1-gone")

	p3 := env.StartProxy(t, flags...)
	waitFor(t, 10*time.Second, "p3 registered", func() bool { return registered(t, c, prefix)[p3.Endpoint] })
	p2.Kill(t)
	// Only p3 is left to answer.
	put(20, "only-p3")
	if v, _ := getValue(t, kv, key); v != "only-p3-19" {
		t.Fatalf("read through etcd:///%s: %q, want only-p3-19", prefix, v)
	}
	// A watch on the resolved connection sees a write made through the front proxy.
	w := clientv3.NewWatchFromWatchClient(pb.NewWatchClient(conn), nil)
	wctx := ctxFor(t, 15*time.Second)
	wch := w.Watch(clientv3.WithRequireLeader(wctx), key, clientv3.WithCreatedNotify())
	if resp := <-wch; !resp.Created {
		t.Fatalf("watch through etcd:///%s: %+v, want created (err %v)", prefix, resp, resp.Err())
	}
	rev := mustPut(t, c, key, "from-front")
	resp := <-wch
	if resp.Err() != nil || len(resp.Events) != 1 || string(resp.Events[0].Kv.Value) != "from-front" ||
		resp.Events[0].Kv.ModRevision != rev {
		t.Fatalf("watch through etcd:///%s: %+v (err %v), want from-front at %d", prefix, resp, resp.Err(), rev)
	}
	_ = w.Close()
}

// serviceConfig balances calls over every resolved proxy; clientv3's retrying interceptor is not on this
// connection, so a call waits for a ready subchannel (a killed proxy's is not) and one that fails Unavailable (sent
// to a proxy as it was killed) is retried, as a gRPC client of a fleet is set up.
const serviceConfig = `{
	"loadBalancingPolicy": "round_robin",
	"methodConfig": [{
		"name": [{"service": "etcdserverpb.KV"}, {"service": "etcdserverpb.Watch"}],
		"waitForReady": true,
		"retryPolicy": {
			"maxAttempts": 5,
			"initialBackoff": "0.1s",
			"maxBackoff": "1s",
			"backoffMultiplier": 2,
			"retryableStatusCodes": ["UNAVAILABLE"]
		}
	}]
}`

// memberURLs are the client URLs MemberList lists through c.
func memberURLs(t testing.TB, c *clientv3.Client) []string {
	t.Helper()
	resp, err := c.MemberList(ctxFor(t, 10*time.Second))
	if err != nil {
		t.Fatalf("member list: %v", err)
	}
	var out []string
	for _, m := range resp.Members {
		out = append(out, m.ClientURLs...)
	}
	return out
}

// memberIDs are the IDs of the members MemberList lists through c, sorted.
func memberIDs(t testing.TB, c *clientv3.Client) []uint64 {
	t.Helper()
	resp, err := c.MemberList(ctxFor(t, 10*time.Second))
	if err != nil {
		t.Fatalf("member list: %v", err)
	}
	var ids []uint64
	for _, m := range resp.Members {
		ids = append(ids, m.ID)
	}
	slices.Sort(ids)
	return ids
}

// hostPort is a URL's host:port (a URL without scheme is one already).
func hostPort(u string) string {
	if i := strings.Index(u, "://"); i >= 0 {
		u = u[i+3:]
	}
	return strings.TrimSuffix(u, "/")
}

func sameSet(got []string, want ...string) bool {
	g := map[string]bool{}
	for _, u := range got {
		g[hostPort(u)] = true
	}
	if len(g) != len(want) {
		return false
	}
	for _, w := range want {
		if !g[hostPort(w)] {
			return false
		}
	}
	return true
}

// TestSyncKeepsProxies: MemberList through the proxy lists etcd's members (their IDs as etcd has them) reached at
// the proxy (its advertise URL), so
// a client's Sync keeps the proxy as its endpoint; with --resolver-prefix every registered proxy is listed, and a
// synced client moves to another of them when its proxy is killed. A client with AutoSyncInterval keeps the
// proxies as its endpoints and keeps working.
func TestSyncKeepsProxies(t *testing.T) {
	env := harness.Get(t)
	if !env.Proxied() {
		t.Skip("directly, MemberList lists etcd's members: nothing of the proxy to keep")
	}
	c := env.Client(t)
	if urls := memberURLs(t, c); !sameSet(urls, env.Endpoints[0]) {
		t.Fatalf("MemberList through the proxy lists %v, want only the proxy %s (etcd's members are %v)", urls, env.Endpoints[0], env.Members)
	}
	// The members are etcd's, with the IDs etcd takes in MoveLeader, MemberUpdate and MemberRemove.
	direct := harness.NewClient(t, env.Members)
	if got, want := memberIDs(t, c), memberIDs(t, direct); !reflect.DeepEqual(got, want) {
		t.Fatalf("MemberList through the proxy lists IDs %x, etcd %x", got, want)
	}
	if err := c.Sync(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("sync: %v", err)
	}
	if eps := c.Endpoints(); !sameSet(eps, env.Endpoints[0]) {
		t.Fatalf("after Sync the client's endpoints are %v, want the proxy %s", eps, env.Endpoints[0])
	}
	mustPut(t, c, env.Prefix(t)+"after-sync", "v")

	// A fleet registered under a prefix: MemberList through any of them lists them all.
	prefix := fmt.Sprintf("goclients-sync-%s-%d", env.Name(), rand.Int63())
	flags := []string{"--resolver-prefix=" + prefix, "--resolver-ttl=2"}
	p1 := env.StartProxy(t, flags...)
	p2 := env.StartProxy(t, flags...)
	c1 := harness.NewClient(t, []string{p1.Endpoint}, func(cfg *clientv3.Config) {
		cfg.AutoSyncInterval = 100 * time.Millisecond
	})
	waitFor(t, 10*time.Second, "MemberList through p1 lists p1 and p2", func() bool {
		return sameSet(memberURLs(t, c1), p1.Endpoint, p2.Endpoint)
	})
	waitFor(t, 10*time.Second, "auto-sync makes p1 and p2 the client's endpoints", func() bool {
		return sameSet(c1.Endpoints(), p1.Endpoint, p2.Endpoint)
	})
	key := env.Prefix(t) + "auto"
	p1.Kill(t)
	// The client goes on through p2 and auto-sync, now through p2, drops p1 once its registration expires. A put
	// in flight on p1 as it was killed fails (clientv3 does not retry a write that may have been applied); once
	// one has gone through p2, every one does.
	waitFor(t, 10*time.Second, "a put through the synced client after p1 was killed", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := c1.Put(ctx, key, "first")
		return err == nil
	})
	for i := 0; i < 10; i++ {
		mustPut(t, c1, key, fmt.Sprint(i))
	}
	waitFor(t, 15*time.Second, "auto-sync leaves p2 alone as the client's endpoint", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := c1.Put(ctx, key, "loop"); err != nil {
			t.Fatalf("put through the synced client after p1 was killed: %v", err)
		}
		return sameSet(c1.Endpoints(), p2.Endpoint)
	})
	if v, _ := getValue(t, c, key); v != "loop" {
		t.Fatalf("the front proxy reads %q, want loop", v)
	}
}
