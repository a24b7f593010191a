// Package kube runs Kubernetes' storage layer (k8s.io/apiserver's etcd3 store and its watch cache) against the
// target of the run: etcd directly, or the proxy under a profile. The generic suites of
// k8s.io/apiserver/pkg/storage/testing run over a store whose etcd client is the harness's client of the target.
package kube

import (
	"context"
	"errors"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"google.golang.org/grpc/grpclog"

	"k8s.io/apimachinery/pkg/api/apitesting"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	etcdfeature "k8s.io/apiserver/pkg/storage/feature"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/utils/clock"

	"etcdproxy.test/goclients/harness"
)

var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
	// exampleProtoCodec is the codec the watch cache's tests store objects with.
	exampleProtoCodec runtime.Codec
)

func init() {
	metav1.AddToGroupVersion(scheme, metav1.SchemeGroupVersion)
	utilruntime.Must(example.AddToScheme(scheme))
	utilruntime.Must(examplev1.AddToScheme(scheme))
	pb := protobuf.NewSerializer(scheme, scheme)
	exampleProtoCodec = codecs.CodecForVersions(pb, pb, schema.GroupVersions{examplev1.SchemeGroupVersion}, nil)
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, os.Stderr))
}

// transformerPrefix is what the store's default transformer (a PrefixTransformer) puts before each value.
const transformerPrefix = "test!"

// jsonCodec is the codec Kubernetes' etcd3 store tests store objects with.
func jsonCodec() runtime.Codec { return apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion) }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func newPod() runtime.Object     { return &example.Pod{} }
func newPodList() runtime.Object { return &example.PodList{} }

// etcdStore is what etcd3.New returns (its type is unexported), as far as these tests use it.
type etcdStore interface {
	storage.Interface
	Close()
	EnableResourceSizeEstimation(storage.KeysFunc) error
	GetCurrentResourceVersion(ctx context.Context) (uint64, error)
}

// swapTransformer is the store's transformer; tests that override the transformer (which Kubernetes does by
// reaching into the store) swap what it delegates to.
type swapTransformer struct {
	mu  sync.RWMutex
	cur value.Transformer
}

func (s *swapTransformer) get() value.Transformer {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cur
}

func (s *swapTransformer) set(t value.Transformer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur = t
}

func (s *swapTransformer) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, bool, error) {
	return s.get().TransformFromStorage(ctx, data, dataCtx)
}

func (s *swapTransformer) TransformToStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, error) {
	return s.get().TransformToStorage(ctx, data, dataCtx)
}

// testStore is an etcd3 store over the target, with what the suites need around it.
type testStore struct {
	etcdStore
	env *harness.Env
	// client is the store's client of the target (its KV records reads).
	client *kubernetes.Client
	kv     *storagetesting.KVRecorder
	lists  *storagetesting.KubernetesRecorder
	codec  runtime.Codec
	// prefix is the store's path prefix, ending in "/"; keys in etcd (through the target) are prefix+"pods/...".
	prefix string
	// base is the default PrefixTransformer (nil when a test gave its own transformer).
	base *storagetesting.PrefixTransformer
	swap *swapTransformer
	// startRV is etcd's revision when the store was made, before the test wrote anything.
	startRV string
}

type storeOptions struct {
	codec       runtime.Codec
	transformer value.Transformer
	lease       etcd3.LeaseManagerConfig
	fixedPrefix string
}

type storeOption func(*storeOptions)

func withCodec(c runtime.Codec) storeOption { return func(o *storeOptions) { o.codec = c } }
func withTransformer(t value.Transformer) storeOption {
	return func(o *storeOptions) { o.transformer = t }
}
func withLease(l etcd3.LeaseManagerConfig) storeOption { return func(o *storeOptions) { o.lease = l } }

// withFixedPrefix gives the store the prefix Kubernetes' tests give it ("/" for the store's, "/registry/" for
// the watch cache's) instead of the test's own, for suites that expect to see that prefix in the keys of errors
// or of recorded requests; the keys under it are deleted before and after the test.
func withFixedPrefix(prefix string) storeOption {
	return func(o *storeOptions) { o.fixedPrefix = prefix }
}

// resetFeatureSupportChecker gives the test a fresh etcdfeature.DefaultFeatureSupportChecker (a package global,
// which remembers RangeStream's absence for 10 minutes and checks each endpoint's version only once), restoring
// the old one when the test ends.
func resetFeatureSupportChecker(t testing.TB) {
	orig := etcdfeature.DefaultFeatureSupportChecker
	etcdfeature.DefaultFeatureSupportChecker = etcdfeature.NewDefaultFeatureSupportChecker()
	t.Cleanup(func() { etcdfeature.DefaultFeatureSupportChecker = orig })
}

// newStore is an etcd3 store whose client is the harness's client of the target, under the test's own prefix.
// The feature support checker is fresh for each store: etcd3.New asks each endpoint's Status (through the
// target) for etcd's version.
func newStore(t testing.TB, opts ...storeOption) *testStore {
	t.Helper()
	env := harness.Get(t)
	o := storeOptions{
		codec: jsonCodec(),
		lease: etcd3.NewDefaultLeaseManagerConfig(),
	}
	// As Kubernetes' tests do: reuse a lease for a second, not a minute.
	o.lease.ReuseDurationSeconds = 1
	for _, opt := range opts {
		opt(&o)
	}
	ts := &testStore{env: env, codec: o.codec, prefix: env.Prefix(t), swap: &swapTransformer{}}
	if o.fixedPrefix != "" {
		ts.prefix = o.fixedPrefix
	}
	if o.transformer == nil {
		ts.base = storagetesting.NewPrefixTransformer([]byte(transformerPrefix), false)
		ts.swap.set(ts.base)
	} else {
		ts.swap.set(o.transformer)
	}

	c := env.Client(t)
	kc := &kubernetes.Client{Client: c}
	ts.lists = storagetesting.NewKubernetesRecorder(kc)
	ts.kv = storagetesting.NewKVRecorder(c.KV, ts.lists)
	kc.KV = ts.kv
	kc.Kubernetes = ts.lists
	ts.client = kc
	if o.fixedPrefix != "" {
		wipe := func() {
			if _, err := c.Delete(context.Background(), ts.prefix+"pods/", clientv3.WithPrefix()); err != nil {
				t.Errorf("delete %spods/: %v", ts.prefix, err)
			}
		}
		wipe()
		t.Cleanup(wipe)
	}

	resp, err := c.Get(context.Background(), ts.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("get %s: %v", ts.prefix, err)
	}
	ts.startRV = strconv.FormatInt(resp.Header.Revision, 10)
	ts.kv.GetReadsAndReset() // the suites count the store's own reads

	resetFeatureSupportChecker(t)
	versioner := storage.APIObjectVersioner{}
	compactor := etcd3.NewCompactor(c, 0, clock.RealClock{}, nil)
	t.Cleanup(compactor.Stop)
	s, err := etcd3.New(kc, compactor, o.codec, newPod, newPodList, ts.prefix, "/pods/",
		schema.GroupResource{Resource: "pods"}, ts.swap, o.lease, etcd3.NewDefaultDecoder(o.codec, versioner), versioner)
	if err != nil {
		t.Fatalf("etcd3.New: %v", err)
	}
	t.Cleanup(s.Close)
	ts.etcdStore = s
	return ts
}

// etcdKey is the key, through the target, that the store keeps the object of storage key key under.
func (s *testStore) etcdKey(key string) string {
	return strings.TrimSuffix(s.prefix, "/") + key
}

// getKeys lists the keys of the store's resource, as the store's own (unexported) getKeys does.
func (s *testStore) getKeys(ctx context.Context) ([]string, error) {
	resp, err := s.client.KV.Get(ctx, s.prefix+"pods/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	return keys, nil
}

// UpdatePrefixTransformer implements storagetesting.InterfaceWithPrefixTransformer.
func (s *testStore) UpdatePrefixTransformer(modifier storagetesting.PrefixTransformerModifier) func() {
	if s.base == nil {
		panic("UpdatePrefixTransformer on a store with a transformer of the test's own")
	}
	orig := s.swap.get()
	copied := *s.base
	s.swap.set(modifier(&copied))
	return func() { s.swap.set(orig) }
}

// UpdateTransformer implements storagetesting.InterfaceWithTransformerOverride.
func (s *testStore) UpdateTransformer(modifier storagetesting.TransformerModifier) func() {
	orig := s.swap.get()
	s.swap.set(modifier(orig))
	return func() { s.swap.set(orig) }
}

// overridable is a storage.Interface (such as the corrupt-object deleter over the store) whose transformer is
// the store's.
type overridable struct {
	storage.Interface
	store *testStore
}

func (o overridable) UpdateTransformer(modifier storagetesting.TransformerModifier) func() {
	return o.store.UpdateTransformer(modifier)
}

// corruptObjectError is the error the store's corrupt-object handling gives an untransformable object (its type
// is unexported: get one from the exported transformer wrapper).
func corruptObjectError(cause error) error {
	failing := failingTransformer{err: cause}
	_, _, err := etcd3.WithCorruptObjErrorHandlingTransformer(failing).TransformFromStorage(context.Background(), nil, nil)
	if err == nil {
		panic("the corrupt-object transformer wrapper passed an error through as nil")
	}
	return err
}

type failingTransformer struct{ err error }

func (f failingTransformer) TransformFromStorage(context.Context, []byte, value.Context) ([]byte, bool, error) {
	return nil, false, f.err
}

func (f failingTransformer) TransformToStorage(context.Context, []byte, value.Context) ([]byte, error) {
	return nil, f.err
}

// checkStoredObject checks, through the target, what the store keeps of a pod: the transformer's prefix, then
// the pod without resourceVersion and selfLink.
func (s *testStore) checkStoredObject() storagetesting.KeyValidation {
	return func(ctx context.Context, t *testing.T, key string) {
		resp, err := s.client.KV.Get(ctx, s.etcdKey(key))
		if err != nil {
			t.Fatalf("get %s: %v", s.etcdKey(key), err)
		}
		if len(resp.Kvs) == 0 {
			t.Fatalf("no key %s through the target", s.etcdKey(key))
		}
		data := resp.Kvs[0].Value
		if !strings.HasPrefix(string(data), transformerPrefix) {
			t.Fatalf("stored value of %s lacks the transformer's prefix: %q", key, data)
		}
		decoded, err := runtime.Decode(s.codec, data[len(transformerPrefix):])
		if err != nil {
			t.Fatalf("decode the stored %s: %v", key, err)
		}
		pod := decoded.(*example.Pod)
		if pod.ResourceVersion != "" || pod.SelfLink != "" {
			t.Errorf("stored object has resourceVersion %q, selfLink %q; want both empty", pod.ResourceVersion, pod.SelfLink)
		}
	}
}

// increaseRV writes a key of the test's own through the target and returns the revision of that write.
func (s *testStore) increaseRV() storagetesting.IncreaseRVFunc {
	return func(ctx context.Context, t *testing.T) int64 {
		resp, err := s.client.KV.Put(ctx, s.prefix+"increaseRV", "ok")
		if err != nil {
			t.Fatalf("increaseRV: %v", err)
		}
		return resp.Header.Revision
	}
}

// compactEtcd compacts etcd at resourceVersion as Kubernetes' compactor does (through the target: the
// compact_rev_key transaction, then the Compact RPC), then waits until the store has seen the compaction (it
// watches compact_rev_key when ListFromCacheSnapshot is on).
func (s *testStore) compactEtcd(ctx context.Context, t testing.TB, resourceVersion string) int64 {
	t.Helper()
	rv, err := storage.APIObjectVersioner{}.ParseResourceVersion(resourceVersion)
	if err != nil {
		t.Fatal(err)
	}
	// etcd3.Compact compacts only if compact_rev_key is at the version it is given (else it answers the version
	// there, having compacted nothing): earlier tests of the run have compacted, so ask again with that version.
	var version, compacted int64
	for attempt := 0; compacted != int64(rv); attempt++ {
		if attempt == 5 {
			t.Fatalf("compact at %d: compact_rev_key kept changing under the test", rv)
		}
		version, _, compacted, err = etcd3.Compact(ctx, s.client.Client, version, int64(rv))
		if err != nil {
			t.Fatalf("compact at %d: %v", rv, err)
		}
	}
	if utilfeature.DefaultFeatureGate.Enabled(features.ListFromCacheSnapshot) {
		waitFor(t, 10*time.Second, "the store to see the compaction at "+resourceVersion, func() bool {
			return s.CompactRevision() == int64(rv)
		})
	}
	return int64(rv)
}

func (s *testStore) compaction() storagetesting.Compaction {
	return func(ctx context.Context, t *testing.T, resourceVersion string) {
		s.compactEtcd(ctx, t, resourceVersion)
	}
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var errSynthetic = errors.New("synthetic error")

// fromTestStart is a store whose watches from resourceVersion "1" start at the test's first revision instead.
// Suites written for a fresh etcd watch from "1" to mean "from the beginning of history"; in the runner's
// cluster earlier tests have compacted, so the beginning of this test's own history (its keys are its own) is
// the revision at which its store was made.
type fromTestStart struct {
	*testStore
}

func (s fromTestStart) Watch(ctx context.Context, key string, opts storage.ListOptions) (watch.Interface, error) {
	if opts.ResourceVersion == "1" {
		opts.ResourceVersion = s.startRV
	}
	return s.testStore.Watch(ctx, key, opts)
}
