package kube

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	etcdfeature "k8s.io/apiserver/pkg/storage/feature"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"

	"etcdproxy.test/goclients/harness"
)

// TestFeatureSupportThroughTarget: apiserver trusts progress requests (which consistent lists from the watch cache
// rest on) only if every endpoint's Status reports etcd ≥ 3.4.31 / ≥ 3.5.13. Through the proxy it must see what it
// sees directly: the Status of each endpoint of the target reports the version a member reports, and the feature
// support checker, given the target's client, finds RequestWatchProgress supported (3.5.30 and 3.7.3 both are).
func TestFeatureSupportThroughTarget(t *testing.T) {
	env := harness.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	members := env.MemberClient(t)
	var memberVersion string
	for _, ep := range env.Members {
		resp, err := members.Status(ctx, ep)
		if err != nil {
			t.Fatalf("Status of member %s: %v", ep, err)
		}
		if memberVersion == "" {
			memberVersion = resp.Version
		} else if resp.Version != memberVersion {
			t.Fatalf("members report versions %q and %q", memberVersion, resp.Version)
		}
	}
	if memberVersion != env.Version {
		t.Errorf("members report version %q; the run is on etcd %s", memberVersion, env.Version)
	}

	target := env.Client(t)
	if len(target.Endpoints()) == 0 {
		t.Fatal("the target's client has no endpoints")
	}
	for _, ep := range target.Endpoints() {
		resp, err := target.Status(ctx, ep)
		if err != nil {
			t.Fatalf("Status through %s: %v", ep, err)
		}
		if resp.Version != memberVersion {
			t.Errorf("Status through %s reports version %q; a member directly reports %q", ep, resp.Version, memberVersion)
		}
		if resp.Header == nil || resp.Header.Revision <= 0 {
			t.Errorf("Status through %s has no revision in its header: %+v", ep, resp.Header)
		}
	}

	checker := etcdfeature.NewDefaultFeatureSupportChecker()
	if checker.Supports(storage.RequestWatchProgress) {
		t.Fatal("a fresh checker supports RequestWatchProgress before it checked any endpoint")
	}
	checker.CheckClient(ctx, target, storage.RequestWatchProgress)
	waitFor(t, 10*time.Second, "the checker to find RequestWatchProgress supported through the target", func() bool {
		return checker.Supports(storage.RequestWatchProgress)
	})

	// The store does the same check when it is made (etcd3.New), on the shared checker.
	newStore(t)
	waitFor(t, 10*time.Second, "the shared checker to find RequestWatchProgress supported after etcd3.New", func() bool {
		return etcdfeature.DefaultFeatureSupportChecker.Supports(storage.RequestWatchProgress)
	})
}

// rangeStreamExpected says whether the target answers RangeStream: etcd 3.7 does, the proxy does on every version
// (it emulates the stream on etcd 3.5), etcd 3.5 directly answers Unimplemented.
func rangeStreamExpected(env *harness.Env) bool {
	return env.Proxied() || env.AtLeast(3, 7, 0)
}

// TestRangeStream: with EtcdRangeStream on, recursive lists of the store go over RangeStream (in several chunks:
// etcd chunks streams at 10 keys) and return every object; where the target lacks RangeStream the store falls
// back to paged lists once and marks the feature unsupported on the shared checker.
func TestRangeStream(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.EtcdRangeStream, true)
	ctx := context.Background()
	s := newStore(t) // with a fresh shared checker
	env := s.env
	if !etcdfeature.DefaultFeatureSupportChecker.Supports(storage.RangeStream) {
		t.Fatal("a fresh checker does not assume RangeStream supported")
	}

	const n = 25
	for i := range n {
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns-%d", i%3), Name: fmt.Sprintf("pod-%02d", i)}}
		if err := s.Create(ctx, fmt.Sprintf("/pods/%s/%s", pod.Namespace, pod.Name), pod, &example.Pod{}, 0); err != nil {
			t.Fatal(err)
		}
	}
	s.kv.GetReadsAndReset()
	s.kv.GetStreamReadsAndReset()

	list := func(t *testing.T, rv string, match metav1.ResourceVersionMatch) *example.PodList {
		t.Helper()
		out := &example.PodList{}
		opts := storage.ListOptions{ResourceVersion: rv, ResourceVersionMatch: match, Predicate: storage.Everything, Recursive: true}
		if err := s.GetList(ctx, "/pods/", opts, out); err != nil {
			t.Fatalf("GetList(rv=%q, match=%q): %v", rv, match, err)
		}
		if out.Continue != "" || out.RemainingItemCount != nil {
			t.Errorf("an unlimited list paginated: continue %q, remainingItemCount %v", out.Continue, out.RemainingItemCount)
		}
		return out
	}

	first := list(t, "", "")
	if len(first.Items) != n {
		t.Fatalf("the recursive list returned %d objects, want %d", len(first.Items), n)
	}
	streams, reads := s.kv.GetStreamReadsAndReset(), s.kv.GetReadsAndReset()
	if streams != 1 {
		t.Errorf("the list asked for %d RangeStreams, want 1", streams)
	}
	supported := etcdfeature.DefaultFeatureSupportChecker.Supports(storage.RangeStream)
	if want := rangeStreamExpected(env); supported != want {
		t.Fatalf("after the list the checker says RangeStream supported=%v; want %v on %s, etcd %s", supported, want, env.Name(), env.Version)
	}
	if supported && reads != 0 {
		t.Errorf("the streamed list also sent %d unary ranges", reads)
	}
	if !supported && reads == 0 {
		t.Errorf("RangeStream was refused, yet no unary range served the list")
	}

	// Pinned and unpinned lists: the snapshot at an exact revision, the latest at a minimum revision.
	extra := &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns-0", Name: "pod-extra"}}
	if err := s.Create(ctx, "/pods/ns-0/pod-extra", extra, &example.Pod{}, 0); err != nil {
		t.Fatal(err)
	}
	exact := list(t, first.ResourceVersion, metav1.ResourceVersionMatchExact)
	if len(exact.Items) != n || exact.ResourceVersion != first.ResourceVersion {
		t.Errorf("the exact list at %s returned %d objects at %s; want %d at %s", first.ResourceVersion, len(exact.Items), exact.ResourceVersion, n, first.ResourceVersion)
	}
	if diff := cmp.Diff(first.Items, exact.Items); diff != "" {
		t.Errorf("the exact list differs from the first list at its revision (-first +exact):\n%s", diff)
	}
	latest := list(t, first.ResourceVersion, metav1.ResourceVersionMatchNotOlderThan)
	if len(latest.Items) != n+1 {
		t.Errorf("the list not older than %s returned %d objects, want %d", first.ResourceVersion, len(latest.Items), n+1)
	}
	streams = s.kv.GetStreamReadsAndReset()
	if supported && streams != 2 {
		t.Errorf("the exact and not-older-than lists asked for %d RangeStreams, want 2", streams)
	}
	if !supported && streams != 0 {
		t.Errorf("after RangeStream was refused, lists asked for it %d more times", streams)
	}
	if got := etcdfeature.DefaultFeatureSupportChecker.Supports(storage.RangeStream); got != supported {
		t.Errorf("RangeStream support flipped from %v to %v over later lists", supported, got)
	}

	// The same list paged (the gate off) returns the same objects.
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.EtcdRangeStream, false)
	paged := list(t, latest.ResourceVersion, metav1.ResourceVersionMatchExact)
	if diff := cmp.Diff(latest.Items, paged.Items); diff != "" {
		t.Errorf("the streamed and the paged list differ (-stream +paged):\n%s", diff)
	}
	if streams := s.kv.GetStreamReadsAndReset(); streams != 0 {
		t.Errorf("with EtcdRangeStream off, the list asked for %d RangeStreams", streams)
	}
}
