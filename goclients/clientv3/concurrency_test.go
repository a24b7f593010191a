package clientv3

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strconv"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"etcdproxy.test/goclients/harness"
)

func session(t testing.TB, c *clientv3.Client) *concurrency.Session {
	t.Helper()
	s, err := concurrency.NewSession(c, concurrency.WithTTL(10))
	if err != nil {
		t.Fatalf("session: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestMutexAcrossProxies: two clients on different proxies (directly: members) take turns with a
// concurrency.Mutex. While one holds it the other's TryLock gets ErrLocked; each holder marks its critical
// section in a key (in, then out) and increments a counter by read-then-write; the key's history must alternate
// in/out of one holder at a time and no increment may be lost.
func TestMutexAcrossProxies(t *testing.T) {
	env := harness.Get(t)
	a, b := peerClients(t, env)
	pfx := env.Prefix(t)
	ma := concurrency.NewMutex(session(t, a), pfx+"lock")
	mb := concurrency.NewMutex(session(t, b), pfx+"lock")

	if err := ma.Lock(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("a locks: %v", err)
	}
	if err := mb.TryLock(ctxFor(t, 10*time.Second)); !errors.Is(err, concurrency.ErrLocked) {
		t.Fatalf("b's TryLock while a holds the lock: %v, want ErrLocked", err)
	}
	if err := ma.Unlock(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("a unlocks: %v", err)
	}

	start := mustPut(t, a, pfx+"holder", "none") + 1
	mustPut(t, a, pfx+"counter", "0")
	const rounds = 8
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for name, pair := range map[string]struct {
		m *concurrency.Mutex
		c *clientv3.Client
	}{"a": {ma, a}, "b": {mb, b}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- func() error {
				for i := 0; i < rounds; i++ {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					defer cancel()
					if err := pair.m.Lock(ctx); err != nil {
						return fmt.Errorf("%s locks: %v", name, err)
					}
					if _, err := pair.c.Put(ctx, pfx+"holder", name+"-in"); err != nil {
						return err
					}
					resp, err := pair.c.Get(ctx, pfx+"counter")
					if err != nil {
						return err
					}
					n, _ := strconv.Atoi(string(resp.Kvs[0].Value))
					if _, err := pair.c.Put(ctx, pfx+"counter", strconv.Itoa(n+1)); err != nil {
						return err
					}
					if _, err := pair.c.Put(ctx, pfx+"holder", name+"-out"); err != nil {
						return err
					}
					if err := pair.m.Unlock(ctx); err != nil {
						return fmt.Errorf("%s unlocks: %v", name, err)
					}
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if v, _ := getValue(t, a, pfx+"counter"); v != strconv.Itoa(2*rounds) {
		t.Fatalf("counter %s after %d locked increments: one was lost", v, 2*rounds)
	}
	// The holder key's history, from etcd's members: in and out of the same client, never interleaved.
	m := env.MemberClient(t)
	resp, err := m.Get(ctxFor(t, 10*time.Second), env.Namespace+pfx+"holder")
	if err != nil {
		t.Fatal(err)
	}
	end := resp.Kvs[0].ModRevision
	var history []string
	for rev := start; rev <= end; rev++ {
		r, err := m.Get(ctxFor(t, 10*time.Second), env.Namespace+pfx+"holder", clientv3.WithRev(rev))
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Kvs) == 1 && r.Kvs[0].ModRevision == rev {
			history = append(history, string(r.Kvs[0].Value))
		}
	}
	if len(history) != 4*rounds {
		t.Fatalf("holder history has %d writes, want %d: %v", len(history), 4*rounds, history)
	}
	for i := 0; i < len(history); i += 2 {
		who := history[i][:1]
		if history[i] != who+"-in" || history[i+1] != who+"-out" {
			t.Fatalf("critical sections interleave at %d: %v", i, history)
		}
	}
}

// TestElectionAcrossProxies: a candidate through one proxy wins, an observer through another sees it; a second
// candidate (other proxy) waits until the first resigns, then wins, and both the observer and Leader through the
// first proxy see it.
func TestElectionAcrossProxies(t *testing.T) {
	env := harness.Get(t)
	a, b := peerClients(t, env)
	pfx := env.Prefix(t) + "election"
	sa, sb := session(t, a), session(t, b)
	ea, eb := concurrency.NewElection(sa, pfx), concurrency.NewElection(sb, pfx)

	octx := ctxFor(t, 30*time.Second)
	observed := concurrency.NewElection(sb, pfx).Observe(octx)
	next := func(want string) {
		t.Helper()
		for {
			select {
			case resp, ok := <-observed:
				if !ok {
					t.Fatalf("observe ended waiting for leader %q", want)
				}
				if got := string(resp.Kvs[0].Value); got == want {
					return
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("observer saw no leader %q", want)
			}
		}
	}

	if err := ea.Campaign(ctxFor(t, 10*time.Second), "a"); err != nil {
		t.Fatalf("a campaigns: %v", err)
	}
	next("a")

	won := make(chan error, 1)
	go func() { won <- eb.Campaign(ctxFor(t, 20*time.Second), "b") }()
	// b must be waiting behind a: its key is in the election, but a leads.
	waitFor(t, 10*time.Second, "b's candidacy recorded", func() bool {
		resp, err := a.Get(ctxFor(t, 5*time.Second), pfx+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 2
	})
	select {
	case err := <-won:
		t.Fatalf("b won while a leads: %v", err)
	default:
	}
	if l, err := eb.Leader(ctxFor(t, 10*time.Second)); err != nil || string(l.Kvs[0].Value) != "a" {
		t.Fatalf("leader through b while a leads: %v %v", l, err)
	}
	if err := ea.Resign(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("a resigns: %v", err)
	}
	select {
	case err := <-won:
		if err != nil {
			t.Fatalf("b campaigns: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b did not win after a resigned")
	}
	next("b")
	if l, err := ea.Leader(ctxFor(t, 10*time.Second)); err != nil || string(l.Kvs[0].Value) != "b" {
		t.Fatalf("leader through a after b won: %v %v", l, err)
	}
	if err := eb.Proclaim(ctxFor(t, 10*time.Second), "b2"); err != nil {
		t.Fatalf("b proclaims: %v", err)
	}
	next("b2")
	if err := eb.Resign(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatalf("b resigns: %v", err)
	}
	if _, err := ea.Leader(ctxFor(t, 10*time.Second)); !errors.Is(err, concurrency.ErrElectionNoLeader) {
		t.Fatalf("leader after both resigned: %v, want ErrElectionNoLeader", err)
	}
}

// TestSTMTransfers: concurrent STM transfers between accounts, through two proxies (directly: members), keep
// the total; each transfer's read-modify-write is one serializable transaction that retries on conflict.
func TestSTMTransfers(t *testing.T) {
	env := harness.Get(t)
	a, b := peerClients(t, env)
	pfx := env.Prefix(t)
	const accounts, each = 5, 100
	account := func(i int) string { return fmt.Sprintf("%saccount/%d", pfx, i) }
	for i := 0; i < accounts; i++ {
		mustPut(t, a, account(i), strconv.Itoa(each))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for w := 0; w < 6; w++ {
		c := a
		if w%2 == 1 {
			c = b
		}
		rng := rand.New(rand.NewSource(int64(w)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				from, to := rng.Intn(accounts), rng.Intn(accounts)
				if from == to {
					to = (to + 1) % accounts
				}
				amount := 1 + rng.Intn(20)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				_, err := concurrency.NewSTM(c, func(s concurrency.STM) error {
					f, _ := strconv.Atoi(s.Get(account(from)))
					g, _ := strconv.Atoi(s.Get(account(to)))
					if f < amount {
						return nil
					}
					s.Put(account(from), strconv.Itoa(f-amount))
					s.Put(account(to), strconv.Itoa(g+amount))
					return nil
				}, concurrency.WithAbortContext(ctx))
				cancel()
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("stm: %v", err)
	}
	resp, err := a.Get(ctxFor(t, 10*time.Second), pfx+"account/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	sum := 0
	for _, kv := range resp.Kvs {
		n, _ := strconv.Atoi(string(kv.Value))
		if n < 0 {
			t.Fatalf("account %s went negative: %d", kv.Key, n)
		}
		sum += n
	}
	if len(resp.Kvs) != accounts || sum != accounts*each {
		t.Fatalf("%d accounts hold %d after the transfers, want %d holding %d", len(resp.Kvs), sum, accounts, accounts*each)
	}
}
