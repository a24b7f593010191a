package clientv3

import (
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"etcdproxy.test/goclients/harness"
)

// TestKeepAliveAcrossFailover: a KeepAlive channel keeps delivering after the member the proxy serves from is
// killed (directly: the member the client is on, among all three), and the lease outlives its TTL: TimeToLive,
// more than TTL seconds after the kill, still gives a positive TTL, and the key under it stays.
func TestKeepAliveAcrossFailover(t *testing.T) {
	env := harness.Get(t)
	c := env.Client(t)
	const ttl = 3
	grant, err := c.Grant(ctxFor(t, 10*time.Second), ttl)
	if err != nil {
		t.Fatalf("grant: %v", err)
	}
	key := env.Prefix(t) + "k"
	if _, err := c.Put(ctxFor(t, 10*time.Second), key, "v", clientv3.WithLease(grant.ID)); err != nil {
		t.Fatalf("put under the lease: %v", err)
	}
	kch, err := c.KeepAlive(ctxFor(t, 60*time.Second), grant.ID)
	if err != nil {
		t.Fatalf("keepalive: %v", err)
	}
	select {
	case ka := <-kch:
		if ka == nil || ka.TTL <= 0 {
			t.Fatalf("first keepalive: %v", ka)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no first keepalive answer")
	}

	victim := env.ActiveMember(t)
	if !env.Proxied() {
		// Directly, kill the member the client's keepalive stream is on, if it can be told: the client is on
		// all three; member 0 is as good as any.
		victim = 0
	}
	env.StopMember(t, victim)
	killed := time.Now()
	waitRenewedPast(t, kch, killed, ttl, fmt.Sprintf("member %d was killed", victim))
	if env.Proxied() {
		if now := env.ActiveMember(t); now == victim {
			t.Fatalf("the proxy still serves from the killed member %d", victim)
		}
	}
	ttlResp, err := c.TimeToLive(ctxFor(t, 10*time.Second), grant.ID)
	if err != nil {
		t.Fatalf("time to live: %v", err)
	}
	if ttlResp.TTL <= 0 {
		t.Fatalf("lease TTL %d %v after the kill: it expired", ttlResp.TTL, time.Since(killed))
	}
	if v, ok := getValue(t, c, key); !ok || v != "v" {
		t.Fatalf("the key under the lease: %q %v", v, ok)
	}
}
