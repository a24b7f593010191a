// Package harness gives each Go test the etcd, or the proxy in front of it, that the Rust runner
// (conformance/tests/go_clients.rs) started for this run, and the actions a test may ask of that runner: stop and
// start an etcd member, name the member the proxy serves from, start and kill more proxies. The runner owns every
// process; a test only asks, so that one test kit (testkit) starts and cleans up everything.
//
// The runner passes the run in GOCLIENTS_* variables. Run outside it (a plain `go test ./...`), every test skips
// with a message saying how to run it.
package harness

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Env is one run: a target (etcd directly, or the proxy under a profile) on one etcd version.
type Env struct {
	// Endpoints are what clients are given: etcd's members directly, or the front proxy.
	Endpoints []string
	// Members are etcd's members' client URLs, whatever the target.
	Members []string
	// Target is "direct" or "proxy".
	Target string
	// Profile is the proxy's flag profile (default, namespace, cache, chain); "direct" for etcd itself.
	Profile string
	// Version is etcd's version, such as "3.7.3".
	Version string
	// Namespace is the prefix under which etcd keeps the keys clients give the target ("" but for namespace).
	Namespace string
	control   string
}

// Get returns the run this test binary was started for, or skips the test outside the runner.
func Get(t testing.TB) *Env {
	t.Helper()
	control := os.Getenv("GOCLIENTS_CONTROL")
	if control == "" {
		t.Skip("run by the Rust runner: cargo test -p conformance --test go_clients")
	}
	return &Env{
		Endpoints: split(os.Getenv("GOCLIENTS_ENDPOINTS")),
		Members:   split(os.Getenv("GOCLIENTS_MEMBERS")),
		Target:    os.Getenv("GOCLIENTS_TARGET"),
		Profile:   os.Getenv("GOCLIENTS_PROFILE"),
		Version:   os.Getenv("GOCLIENTS_ETCD_VERSION"),
		Namespace: os.Getenv("GOCLIENTS_NAMESPACE"),
		control:   control,
	}
}

func split(list string) []string {
	var out []string
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Proxied says whether clients talk to the proxy (else to etcd's members directly).
func (e *Env) Proxied() bool { return e.Target == "proxy" }

// Name is the run's name in messages and key prefixes: "direct" or "proxy-<profile>".
func (e *Env) Name() string {
	if e.Proxied() {
		return "proxy-" + e.Profile
	}
	return "direct"
}

// AtLeast says whether etcd's version is at least major.minor.patch.
func (e *Env) AtLeast(major, minor, patch int) bool {
	var v [3]int
	for i, part := range strings.SplitN(e.Version, ".", 3) {
		v[i], _ = strconv.Atoi(part)
	}
	want := [3]int{major, minor, patch}
	for i := range v {
		if v[i] != want[i] {
			return v[i] > want[i]
		}
	}
	return true
}

// Prefix is a key prefix of this test's own in this run, ending in "/".
func (e *Env) Prefix(t testing.TB) string {
	return "/goclients/" + e.Name() + "/" + strings.ReplaceAll(t.Name(), "/", "_") + "/"
}

// Config is a clientv3 configuration for endpoints, quiet, with a dial deadline.
func Config(endpoints []string) clientv3.Config {
	return clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
	}
}

// Client is a clientv3 client of the target, closed when the test ends; change adjusts its configuration first.
func (e *Env) Client(t testing.TB, change ...func(*clientv3.Config)) *clientv3.Client {
	t.Helper()
	return NewClient(t, e.Endpoints, change...)
}

// MemberClient is a clientv3 client of etcd's members directly, whatever the target: for checking what etcd
// holds, and for setting etcd up (it sees keys under the namespace, if any).
func (e *Env) MemberClient(t testing.TB) *clientv3.Client {
	t.Helper()
	return NewClient(t, e.Members)
}

// NewClient is a clientv3 client of endpoints, closed when the test ends.
func NewClient(t testing.TB, endpoints []string, change ...func(*clientv3.Config)) *clientv3.Client {
	t.Helper()
	cfg := Config(endpoints)
	for _, c := range change {
		c(&cfg)
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		t.Fatalf("clientv3 on %v: %v", endpoints, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// StopMember kills etcd member i (SIGKILL); it is started again when the test ends, if it has not been.
func (e *Env) StopMember(t testing.TB, i int) {
	t.Helper()
	e.ask(t, "POST", fmt.Sprintf("/member/stop?i=%d", i), "")
	t.Cleanup(func() { e.ask(t, "POST", fmt.Sprintf("/member/start?i=%d", i), "") })
}

// StartMember starts etcd member i again (a no-op if it runs) and waits until it serves.
func (e *Env) StartMember(t testing.TB, i int) {
	t.Helper()
	e.ask(t, "POST", fmt.Sprintf("/member/start?i=%d", i), "")
}

// ActiveMember is the index in Members of the member the proxy next to etcd serves from (read from its
// etcd_grpc_proxy_upstream_active metric); directly, 0.
func (e *Env) ActiveMember(t testing.TB) int {
	t.Helper()
	i, err := strconv.Atoi(e.ask(t, "GET", "/member/active", ""))
	if err != nil {
		t.Fatalf("the runner named no active member: %v", err)
	}
	return i
}

// Proxy is a proxy a test started, in front of etcd's members.
type Proxy struct {
	ID       int
	Endpoint string
	env      *Env
}

// StartProxy starts the proxy binary in front of etcd's members with the run's profile flags and flags (as a
// user writes them), waits until it is healthy, and kills it when the test ends.
func (e *Env) StartProxy(t testing.TB, flags ...string) *Proxy {
	t.Helper()
	answer := strings.Fields(e.ask(t, "POST", "/proxy/start", strings.Join(flags, "\n")))
	if len(answer) != 2 {
		t.Fatalf("the runner answered %q to a proxy start", answer)
	}
	id, err := strconv.Atoi(answer[0])
	if err != nil {
		t.Fatalf("proxy id %q: %v", answer[0], err)
	}
	p := &Proxy{ID: id, Endpoint: answer[1], env: e}
	t.Cleanup(func() { p.Kill(t) })
	return p
}

// Kill kills the proxy (SIGKILL); killing it twice is a no-op.
func (p *Proxy) Kill(t testing.TB) {
	t.Helper()
	p.env.ask(t, "POST", fmt.Sprintf("/proxy/kill?id=%d", p.ID), "")
}

func (e *Env) ask(t testing.TB, method, path, body string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, e.control+path, strings.NewReader(body))
	if err != nil {
		t.Fatalf("runner request %s: %v", path, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("runner %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("runner %s %s: reading the answer: %v", method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("runner %s %s: %d %s", method, path, resp.StatusCode, text)
	}
	return strings.TrimSpace(string(text))
}
