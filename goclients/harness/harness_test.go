package harness

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The run is what the runner says it is: a key written through the target is in etcd under the run's namespace.
func TestTargetWritesWhereEtcdKeepsTheRunsKeys(t *testing.T) {
	env := Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key := env.Prefix(t) + "k"
	if _, err := env.Client(t).Put(ctx, key, "v"); err != nil {
		t.Fatalf("put through %s: %v", env.Name(), err)
	}
	got, err := env.MemberClient(t).Get(ctx, env.Namespace+key)
	if err != nil {
		t.Fatalf("get from etcd: %v", err)
	}
	if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "v" {
		t.Fatalf("etcd holds %v under %q", got.Kvs, env.Namespace+key)
	}
	if len(env.Members) != 3 {
		t.Fatalf("the runner gave %d members, want 3", len(env.Members))
	}
}

// The runner's actions do what they say: a proxy it starts serves and is gone once killed; a stopped member
// refuses and serves again once started; the active member is one of the members.
func TestRunnerActions(t *testing.T) {
	env := Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	active := env.ActiveMember(t)
	if active < 0 || active >= len(env.Members) {
		t.Fatalf("active member %d of %d", active, len(env.Members))
	}
	p := env.StartProxy(t)
	key := env.Prefix(t) + "k"
	c := NewClient(t, []string{p.Endpoint})
	if _, err := c.Put(ctx, key, "through another proxy"); err != nil {
		t.Fatalf("put through the started proxy: %v", err)
	}
	p.Kill(t)
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	if _, err := c.Get(short, key); err == nil {
		t.Fatalf("a killed proxy answered")
	}
	member := NewClient(t, env.Members[2:3])
	env.StopMember(t, 2)
	short2, cancelShort2 := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort2()
	if _, err := member.Get(short2, key, clientv3.WithSerializable()); err == nil {
		t.Fatalf("a stopped member answered")
	}
	env.StartMember(t, 2)
	if _, err := member.Get(ctx, key, clientv3.WithSerializable()); err != nil {
		t.Fatalf("the restarted member: %v", err)
	}
}
