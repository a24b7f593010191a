package clientv3

import (
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
	// Keep reading until TTL+1 seconds after the kill; a keepalive answer must arrive after the TTL has run out.
	var after int
	until := time.After(time.Duration(ttl+1)*time.Second + 500*time.Millisecond)
	for done := false; !done; {
		select {
		case ka, ok := <-kch:
			if !ok {
				t.Fatalf("the keepalive channel closed %v after member %d was killed", time.Since(killed), victim)
			}
			if ka.TTL <= 0 {
				t.Fatalf("keepalive answer with TTL %d after the kill", ka.TTL)
			}
			if time.Since(killed) > ttl*time.Second {
				after++
			}
		case <-until:
			done = true
		}
	}
	if env.Proxied() {
		if now := env.ActiveMember(t); now == victim {
			t.Fatalf("the proxy still serves from the killed member %d", victim)
		}
	}
	// clientv3 sends a keepalive every TTL/3 s: more than TTL s on, at least one answer came past the TTL.
	if after == 0 {
		t.Fatalf("no keepalive answer more than %d s after member %d was killed", ttl, victim)
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
