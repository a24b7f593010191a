package clientv3

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"etcdproxy.test/goclients/harness"
)

// TestMutexHolderLost: a Mutex holder whose front door dies (its proxy killed; directly, the only member its
// client knows) stops renewing its session; once its lease expires the waiter, through the run's proxy
// (directly: another member), gets the lock, and not before.
func TestMutexHolderLost(t *testing.T) {
	env := harness.Get(t)
	pfx := env.Prefix(t)
	var holder *clientv3.Client
	var lose func()
	waiter := env.Client(t)
	if env.Proxied() {
		p := env.StartProxy(t)
		holder = harness.NewClient(t, []string{p.Endpoint})
		lose = func() { p.Kill(t) }
	} else {
		holder = harness.NewClient(t, env.Members[1:2])
		waiter = harness.NewClient(t, env.Members[:1])
		lose = func() { env.StopMember(t, 1) }
	}
	const ttl = 2
	hs, err := concurrency.NewSession(holder, concurrency.WithTTL(ttl))
	if err != nil {
		t.Fatalf("holder session: %v", err)
	}
	defer func() { _ = hs.Close() }()
	if err := concurrency.NewMutex(hs, pfx+"lock").Lock(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("holder locks: %v", err)
	}
	ws := session(t, waiter)
	wm := concurrency.NewMutex(ws, pfx+"lock")
	got := make(chan error, 1)
	go func() { got <- wm.Lock(ctxFor(t, 30*time.Second)) }()
	// The waiter is queued behind the holder, which still renews.
	waitFor(t, 10*time.Second, "the waiter queued", func() bool {
		resp, err := waiter.Get(ctxFor(t, 5*time.Second), pfx+"lock/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 2
	})
	select {
	case err := <-got:
		t.Fatalf("the waiter locked while the holder holds: %v", err)
	case <-time.After(time.Duration(ttl+1) * time.Second):
		// More than the TTL: the holder's renewals keep its lease.
	}
	lose()
	lost := time.Now()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter locks: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter did not get the lock after the holder was lost")
	}
	t.Logf("the waiter locked %v after the holder was lost", time.Since(lost).Round(time.Millisecond))
	ttlResp, err := waiter.TimeToLive(ctxFor(t, 10*time.Second), hs.Lease())
	if err != nil {
		t.Fatalf("time to live of the holder's lease: %v", err)
	}
	if ttlResp.TTL != -1 {
		t.Fatalf("the waiter locked while the holder's lease lives (TTL %d)", ttlResp.TTL)
	}
	if err := wm.Unlock(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("waiter unlocks: %v", err)
	}
}

// TestObserveAcrossFailover: an election observer through the proxy sees every leader value proclaimed while the
// member the proxy serves from is killed, in order, none twice (its watch resumes on another member from where it
// was); directly, the observer's client is on all members and member 0 is killed. The candidate is on another
// member, unaffected.
func TestObserveAcrossFailover(t *testing.T) {
	env := harness.Get(t)
	pfx := env.Prefix(t) + "election"
	observer := env.Client(t)
	if !env.Proxied() {
		observer = harness.NewClient(t, env.Members)
	}
	// The candidate is on a member that stays up: a write in flight on a killed member may fail, and clientv3 does
	// not retry it.
	active := env.ActiveMember(t)
	candidate := harness.NewClient(t, env.Members[(active+1)%len(env.Members):][:1])
	e := concurrency.NewElection(session(t, candidate), env.Namespace+pfx)
	octx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	observed := concurrency.NewElection(session(t, observer), pfx).Observe(octx)
	if err := e.Campaign(ctxFor(t, 10*time.Second), "v0"); err != nil {
		t.Fatalf("campaign: %v", err)
	}
	next := func() string {
		t.Helper()
		select {
		case resp, ok := <-observed:
			if !ok {
				t.Fatal("observe ended")
			}
			return string(resp.Kvs[0].Value)
		case <-time.After(20 * time.Second):
			t.Fatal("the observer saw nothing more")
		}
		return ""
	}
	if v := next(); v != "v0" {
		t.Fatalf("observed %q, want v0", v)
	}
	const n = 20
	done := make(chan error, 1)
	next = func() string {
		t.Helper()
		select {
		case resp, ok := <-observed:
			if !ok {
				t.Fatal("observe ended")
			}
			return string(resp.Kvs[0].Value)
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			done <- nil
			return next()
		case <-time.After(20 * time.Second):
			t.Fatal("the observer saw nothing more")
		}
		return ""
	}
	go func() {
		deadline := time.Now().Add(30 * time.Second)
		for i := 1; i <= n; {
			if time.Now().After(deadline) {
				done <- fmt.Errorf("proclaim v%d: not applied within 30 s", i)
				return
			}
			value := fmt.Sprintf("v%d", i)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := e.Proclaim(ctx, value)
			cancel()
			if err != nil {
				// Killing etcd's raft leader times out the proposals it held ("request timed out, possibly due
				// to previous leader failure"): once a linearizable read succeeds (a new leader has applied all
				// that was committed), the proclamation either is there or is lost for good.
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, gerr := candidate.Get(ctx, e.Key())
				cancel()
				if gerr != nil || len(resp.Kvs) == 0 || string(resp.Kvs[0].Value) != value {
					continue
				}
			}
			i++
			time.Sleep(50 * time.Millisecond) // spread the values over the failover
		}
		done <- nil
	}()
	if v := next(); v != "v1" {
		t.Fatalf("observed %q, want v1", v)
	}
	env.StopMember(t, active)
	for i := 2; i <= n; i++ {
		if v, want := next(), fmt.Sprintf("v%d", i); v != want {
			t.Fatalf("observed %q, want %q: a leader value lost or repeated across the failover", v, want)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
