package clientv3

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"etcdproxy.test/goclients/harness"
)

// TestWatchRequireLeaderQuorumLoss: a WithRequireLeader watch ends with etcd's "no leader" error when the member
// serving it loses its leader (the two other members are killed), as etcd ends it itself; once they are back, a
// new watch works. Through the proxy the members killed are the two the proxy does not serve from.
func TestWatchRequireLeaderQuorumLoss(t *testing.T) {
	env := harness.Get(t)
	active := env.ActiveMember(t)
	c := env.Client(t)
	if !env.Proxied() {
		// Directly, the client must be on the member that stays up.
		c = harness.NewClient(t, env.Members[active:active+1])
	}
	key := env.Prefix(t) + "k"
	wch := requireLeaderWatch(t, c, key)

	var stopped []int
	for i := range env.Members {
		if i != active {
			env.StopMember(t, i)
			stopped = append(stopped, i)
		}
	}
	awaitNoLeaderEnd(t, wch, "losing quorum")
	if _, ok := <-wch; ok {
		t.Fatal("the watch channel delivered more after its no-leader end")
	}

	for _, i := range stopped {
		env.StartMember(t, i)
	}
	waitFor(t, 30*time.Second, "a put succeeds once quorum is back", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := c.Put(ctx, key, "after")
		return err == nil
	})
	wctx := ctxFor(t, 20*time.Second)
	wch = c.Watch(clientv3.WithRequireLeader(wctx), key, clientv3.WithCreatedNotify())
	if resp := <-wch; !resp.Created {
		t.Fatalf("watch after recovery: %+v (err %v), want created", resp, resp.Err())
	}
	rev := mustPut(t, c, key, "again")
	if resp := <-wch; len(resp.Events) != 1 || resp.Events[0].Kv.ModRevision != rev {
		t.Fatalf("watch after recovery: %+v (err %v), want the put at %d", resp, resp.Err(), rev)
	}
}

// TestWatchRequireLeaderActiveLost: as TestWatchRequireLeaderQuorumLoss, but the member serving the watch is
// among the two killed: through the proxy, its active member and one more (the proxy moves to the last member,
// which has no leader); directly, the client is on all members and members 0 and 1 are killed (if its stream was
// on one of them, it moves to the survivor, which has no leader). The watch must end with the no-leader error.
func TestWatchRequireLeaderActiveLost(t *testing.T) {
	env := harness.Get(t)
	active := env.ActiveMember(t)
	other := (active + 1) % len(env.Members)
	survivor := (active + 2) % len(env.Members)
	c := env.Client(t)
	if !env.Proxied() {
		// Directly, the client is on all members: it moves to the survivor, which has no leader.
		c = harness.NewClient(t, env.Members)
	}
	key := env.Prefix(t) + "k"
	wch := requireLeaderWatch(t, c, key)
	env.StopMember(t, active)
	env.StopMember(t, other)
	awaitNoLeaderEnd(t, wch, fmt.Sprintf("losing members %d and %d (survivor %d)", active, other, survivor))
	env.StartMember(t, active)
	env.StartMember(t, other)
	waitFor(t, 30*time.Second, "a put succeeds once quorum is back", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := c.Put(ctx, key, "after")
		return err == nil
	})
}

// TestWatchRequestProgress: RequestProgress on a watch stream brings every watcher on it (two watchers, on keys
// no write touches, one of them started at an old revision) a progress notification whose revision is at least
// the newest write's.
func TestWatchRequestProgress(t *testing.T) {
	env := harness.Get(t)
	c := env.Client(t)
	pfx := env.Prefix(t)
	ctx := ctxFor(t, 20*time.Second)
	old := mustPut(t, c, pfx+"other/start", "v")
	w1 := c.Watch(ctx, pfx+"watched/1", clientv3.WithCreatedNotify())
	w2 := c.Watch(ctx, pfx+"watched/2", clientv3.WithCreatedNotify(), clientv3.WithRev(old))
	for _, wch := range []clientv3.WatchChan{w1, w2} {
		if resp := <-wch; !resp.Created {
			t.Fatalf("watch: %+v (err %v), want created", resp, resp.Err())
		}
	}
	var rev int64
	for i := 0; i < 3; i++ {
		rev = mustPut(t, c, fmt.Sprintf("%sother/%d", pfx, i), "v")
	}
	if err := c.RequestProgress(ctx); err != nil {
		t.Fatalf("request progress: %v", err)
	}
	// etcd answers a progress request only while every watcher of the stream is synced: ask again until a
	// notification at the newest write's revision reaches both.
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	caught := [2]bool{}
	for !caught[0] || !caught[1] {
		var resp clientv3.WatchResponse
		var ok bool
		var which int
		select {
		case resp, ok = <-w1:
		case resp, ok = <-w2:
			which = 1
		case <-tick.C:
			if err := c.RequestProgress(ctx); err != nil {
				t.Fatalf("request progress: %v", err)
			}
			continue
		case <-deadline:
			t.Fatalf("no progress notification at revision >= %d to both watchers (caught %v)", rev, caught)
		}
		if !ok {
			t.Fatalf("watcher %d ended", which+1)
		}
		if len(resp.Events) > 0 {
			t.Fatalf("events on an unwritten key: %v", resp.Events)
		}
		if !resp.IsProgressNotify() {
			t.Fatalf("watcher %d: %+v, want a progress notification", which+1, resp)
		}
		if resp.Header.Revision >= rev {
			caught[which] = true
		}
	}
}

// TestCompacted: after a compaction, a watch from a compacted revision ends with CompactRevision and
// ErrCompacted, and a Get at a compacted revision fails with rpctypes.ErrCompacted.
func TestCompacted(t *testing.T) {
	env := harness.Get(t)
	c := env.Client(t)
	key := env.Prefix(t) + "k"
	r1 := mustPut(t, c, key, "1")
	mustPut(t, c, key, "2")
	r3 := mustPut(t, c, key, "3")
	if _, err := c.Compact(ctxFor(t, 10*time.Second), r3, clientv3.WithCompactPhysical()); err != nil {
		t.Fatalf("compact at %d: %v", r3, err)
	}
	if _, err := c.Get(ctxFor(t, 10*time.Second), key, clientv3.WithRev(r1)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("get at compacted revision %d: %v, want %v", r1, err, rpctypes.ErrCompacted)
	}
	if resp, err := c.Get(ctxFor(t, 10*time.Second), key, clientv3.WithRev(r3)); err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "3" {
		t.Fatalf("get at the compaction revision %d: %v %v, want 3", r3, resp, err)
	}
	wch := c.Watch(ctxFor(t, 10*time.Second), key, clientv3.WithRev(r1))
	select {
	case resp, ok := <-wch:
		if !ok {
			t.Fatal("the watch closed without an answer")
		}
		if resp.CompactRevision != r3 || !errors.Is(resp.Err(), rpctypes.ErrCompacted) || !resp.Canceled {
			t.Fatalf("watch from compacted %d: compact revision %d, canceled %v, err %v; want %d, true, %v",
				r1, resp.CompactRevision, resp.Canceled, resp.Err(), r3, rpctypes.ErrCompacted)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no answer to a watch from a compacted revision")
	}
	if _, ok := <-wch; ok {
		t.Fatal("the compacted watch delivered more")
	}
	// From the compaction revision itself the history is whole.
	wch = c.Watch(ctxFor(t, 10*time.Second), key, clientv3.WithRev(r3))
	if resp := <-wch; resp.Err() != nil || len(resp.Events) != 1 || string(resp.Events[0].Kv.Value) != "3" {
		t.Fatalf("watch from %d: %+v (err %v), want the put of 3", r3, resp, resp.Err())
	}
}

// requireLeaderWatch is a WithRequireLeader watch of key through c that etcd has created and that has delivered a
// put of key; the watch ends with the test.
func requireLeaderWatch(t *testing.T, c *clientv3.Client, key string) clientv3.WatchChan {
	t.Helper()
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	t.Cleanup(cancel)
	wch := c.Watch(ctx, key, clientv3.WithCreatedNotify())
	if resp := <-wch; !resp.Created {
		t.Fatalf("watch: %+v (err %v), want created", resp, resp.Err())
	}
	mustPut(t, c, key, "before")
	if resp := <-wch; len(resp.Events) != 1 {
		t.Fatalf("watch: %+v (err %v), want the put", resp, resp.Err())
	}
	return wch
}

// awaitNoLeaderEnd waits (30 s at most) until the watch ends with etcd's no-leader error after what happened,
// failing on any event meanwhile or on another end.
func awaitNoLeaderEnd(t *testing.T, wch clientv3.WatchChan, what string) {
	t.Helper()
	began := time.Now()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case resp, ok := <-wch:
			if !ok {
				t.Fatal("the watch channel closed without the no-leader error")
			}
			if len(resp.Events) > 0 {
				t.Fatalf("events after %s: %v", what, resp.Events)
			}
			if err := resp.Err(); err != nil {
				if !errors.Is(err, rpctypes.ErrNoLeader) {
					t.Fatalf("watch ended with %v, want %v", err, rpctypes.ErrNoLeader)
				}
				t.Logf("the watch ended with no leader %v after %s", time.Since(began).Round(time.Millisecond), what)
				return
			}
		case <-timeout:
			t.Fatalf("the require-leader watch did not end within 30 s of %s", what)
		}
	}
}
