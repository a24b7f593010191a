package kube

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/cacher"
	"k8s.io/apiserver/pkg/storage/etcd3"
	etcdfeature "k8s.io/apiserver/pkg/storage/feature"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/tools/cache"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/utils/clock"

	"etcdproxy.test/goclients/harness"
)

func podAttrs(obj runtime.Object) (labels.Set, fields.Set, error) {
	pod, ok := obj.(*example.Pod)
	if !ok {
		return nil, nil, fmt.Errorf("not a pod: %T", obj)
	}
	return labels.Set(pod.Labels), fields.Set{
		"spec.nodeName":      pod.Spec.NodeName,
		"spec.restartPolicy": string(pod.Spec.RestartPolicy),
		"status.phase":       string(pod.Status.Phase),
		"metadata.name":      pod.Name,
		"metadata.namespace": pod.Namespace,
	}, nil
}

type cacherOptions struct {
	store         []storeOption
	clusterScoped bool
	indexed       bool
}

type cacherOption func(*cacherOptions)

func cacherStore(opts ...storeOption) cacherOption {
	return func(o *cacherOptions) { o.store = append(o.store, opts...) }
}

func clusterScoped(o *cacherOptions) { o.clusterScoped = true }

// nodeNameAndNamespaceIndex indexes as Kubernetes' pod registry does.
func nodeNameAndNamespaceIndex(o *cacherOptions) { o.indexed = true }

// testCacher is a watch cache (Kubernetes' cacher, through its delegator) over an etcd3 store of the target.
type testCacher struct {
	*cacher.CacheDelegator
	store *testStore
}

// newCacher builds the watch cache as Kubernetes' cacher tests do: the store refuses the first list (the cache
// must relist), then the test waits until the cache is ready and until the feature support checker, which asked
// the target's Status for etcd's version, says progress requests are supported (so consistent lists are served
// from the cache, after a progress request to etcd through the target).
func newCacher(t *testing.T, opts ...cacherOption) *testCacher {
	t.Helper()
	o := cacherOptions{}
	for _, opt := range opts {
		opt(&o)
	}
	store := newStore(t, append([]storeOption{withCodec(exampleProtoCodec), withTransformer(identity.NewEncryptCheckTransformer())}, o.store...)...)

	listErrors := 1
	if clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient) {
		// The reflector then watches with initial events instead of listing.
		listErrors = 0
	}
	wrapped := &storagetesting.StorageInjectingListErrors{Interface: store, Errors: listErrors}
	const prefix = "/pods/"
	keyFunc := func(obj runtime.Object) (string, error) { return storage.NamespaceKeyFunc(prefix, obj) }
	if o.clusterScoped {
		keyFunc = func(obj runtime.Object) (string, error) { return storage.NoNamespaceKeyFunc(prefix, obj) }
	}
	config := cacher.Config{
		Storage:             wrapped,
		Versioner:           storage.APIObjectVersioner{},
		GroupResource:       schema.GroupResource{Resource: "pods"},
		EventsHistoryWindow: cacher.DefaultEventFreshDuration,
		ResourcePrefix:      prefix,
		KeyFunc:             keyFunc,
		GetAttrsFunc:        podAttrs,
		NewFunc:             newPod,
		NewListFunc:         newPodList,
		Codec:               exampleProtoCodec,
		Clock:               fastCompactorClock{},
	}
	if o.indexed {
		config.IndexerFuncs = storage.IndexerFuncs{"spec.nodeName": func(obj runtime.Object) string {
			if pod, ok := obj.(*example.Pod); ok {
				return pod.Spec.NodeName
			}
			return ""
		}}
		config.Indexers = &cache.Indexers{
			"f:spec.nodeName":      func(obj any) ([]string, error) { return []string{obj.(*example.Pod).Spec.NodeName}, nil },
			"f:metadata.namespace": func(obj any) ([]string, error) { return []string{obj.(*example.Pod).Namespace}, nil },
		}
	}
	c, err := cacher.NewCacherFromConfig(config)
	if err != nil {
		t.Fatalf("NewCacherFromConfig: %v", err)
	}
	t.Cleanup(c.Stop)
	waitFor(t, 30*time.Second, "the watch cache to consume the injected list error", func() bool {
		consumed, _ := wrapped.ErrorsConsumed()
		return consumed
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Wait(ctx); err != nil {
		t.Fatalf("the watch cache did not get ready: %v", err)
	}
	waitFor(t, 10*time.Second, "the feature support checker to find RequestWatchProgress supported (Status through the target)", func() bool {
		return etcdfeature.DefaultFeatureSupportChecker.Supports(storage.RequestWatchProgress)
	})
	d := cacher.NewCacheDelegator(c, wrapped)
	t.Cleanup(d.Stop)
	return &testCacher{CacheDelegator: d, store: store}
}

// fastCompactorClock is the real clock, but for the watch cache's compactor, which polls the store's compaction
// revision every 15 seconds: it polls every 100ms. (Kubernetes' tests make it poll by calling it, through
// unexported fields.) No other timer of the cache lasts 15 seconds.
type fastCompactorClock struct{ clock.RealClock }

const compactorPollPeriod = 15 * time.Second

func shorten(d time.Duration) time.Duration {
	if d == compactorPollPeriod {
		return 100 * time.Millisecond
	}
	return d
}

func (fastCompactorClock) NewTimer(d time.Duration) clock.Timer {
	return shortTimer{clock.RealClock{}.NewTimer(shorten(d))}
}

type shortTimer struct{ clock.Timer }

func (s shortTimer) Reset(d time.Duration) bool { return s.Timer.Reset(shorten(d)) }

// compaction compacts etcd (through the target) and waits until the watch cache has seen it too (its compactor
// polls the store's compaction revision), after which an exact list at a revision before the compaction is
// refused as too old.
func (c *testCacher) compaction() storagetesting.Compaction {
	return func(ctx context.Context, t *testing.T, resourceVersion string) {
		rv := c.store.compactEtcd(ctx, t, resourceVersion)
		old := fmt.Sprint(rv - 1)
		waitFor(t, 25*time.Second, "the watch cache to see the compaction at "+resourceVersion, func() bool {
			err := c.GetList(ctx, "/pods/", storage.ListOptions{
				ResourceVersion: old, ResourceVersionMatch: metav1.ResourceVersionMatchExact,
				Predicate: storage.Everything, Recursive: true,
			}, &example.PodList{})
			return err != nil && strings.Contains(err.Error(), "too old")
		})
	}
}

// createThenSeen is the cache whose Create returns once the cache serves the created object (Kubernetes' cacher
// tests' createWrapper): the watch suites expect to watch from a revision the cache has.
type createThenSeen struct {
	*testCacher
}

func (c createThenSeen) Create(ctx context.Context, key string, obj, out runtime.Object, ttl uint64) error {
	if err := c.testCacher.Create(ctx, key, obj, out, ttl); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, wait.ForeverTestTimeout, true, func(ctx context.Context) (bool, error) {
		current := newPod()
		err := c.testCacher.Get(ctx, key, storage.GetOptions{ResourceVersion: "0"}, current)
		if storage.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		return apiequality.Semantic.DeepEqual(current, out), nil
	})
}

func (c createThenSeen) Watch(ctx context.Context, key string, opts storage.ListOptions) (watch.Interface, error) {
	if opts.ResourceVersion == "1" {
		opts.ResourceVersion = c.store.startRV
	}
	return c.testCacher.Watch(ctx, key, opts)
}

// rangeStreamOn turns EtcdRangeStream on for the test: the watch cache's lists of etcd (its initial list and
// relists) go over RangeStream where etcd or the proxy has it.
func rangeStreamOn(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.EtcdRangeStream, true)
}

// TestCacher runs the suites Kubernetes runs against its watch cache (cacher_test.go) over a cache of an etcd3
// store of the target, with consistent lists from the cache (progress requests go to etcd through the target)
// and EtcdRangeStream on.
func TestCacher(t *testing.T) {
	ctx := context.Background()
	plain := map[string]func(context.Context, *testing.T, storage.Interface){
		"CreateWithTTL":                             storagetesting.RunTestCreateWithTTL,
		"CreateWithKeyExist":                        storagetesting.RunTestCreateWithKeyExist,
		"Get":                                       storagetesting.RunTestGet,
		"UnconditionalDelete":                       storagetesting.RunTestUnconditionalDelete,
		"ConditionalDelete":                         storagetesting.RunTestConditionalDelete,
		"DeleteWithSuggestion":                      storagetesting.RunTestDeleteWithSuggestion,
		"DeleteWithSuggestionAndConflict":           storagetesting.RunTestDeleteWithSuggestionAndConflict,
		"DeleteWithSuggestionOfDeletedObject":       storagetesting.RunTestDeleteWithSuggestionOfDeletedObject,
		"ValidateDeletionWithSuggestion":            storagetesting.RunTestValidateDeletionWithSuggestion,
		"ValidateDeletionWithOnlySuggestionValid":   storagetesting.RunTestValidateDeletionWithOnlySuggestionValid,
		"DeleteWithConflict":                        storagetesting.RunTestDeleteWithConflict,
		"PreconditionalDeleteWithSuggestion":        storagetesting.RunTestPreconditionalDeleteWithSuggestion,
		"PreconditionalDeleteWithSuggestionPass":    storagetesting.RunTestPreconditionalDeleteWithOnlySuggestionPass,
		"ListPaging":                                storagetesting.RunTestListPaging,
		"GetListRecursivePrefix":                    storagetesting.RunTestGetListRecursivePrefix,
		"GuaranteedUpdateWithTTL":                   storagetesting.RunTestGuaranteedUpdateWithTTL,
		"GuaranteedUpdateWithConflict":              storagetesting.RunTestGuaranteedUpdateWithConflict,
		"GuaranteedUpdateWithSuggestionAndConflict": storagetesting.RunTestGuaranteedUpdateWithSuggestionAndConflict,
		"KeySchema":                                 storagetesting.RunTestKeySchema,
	}
	noCalls := func(*testing.T, uint64, uint64) {} // the cache passes paged lists to the store
	paged := map[string]func(context.Context, *testing.T, storage.Interface, storagetesting.CallsValidation){
		"ListContinuation":           storagetesting.RunTestListContinuation,
		"ListPaginationRareObject":   storagetesting.RunTestListPaginationRareObject,
		"ListContinuationWithFilter": storagetesting.RunTestListContinuationWithFilter,
	}
	for _, name := range sortedKeys(plain) {
		t.Run(name, func(t *testing.T) {
			rangeStreamOn(t)
			plain[name](ctx, t, newCacher(t))
		})
	}
	for _, name := range sortedKeys(paged) {
		t.Run(name, func(t *testing.T) {
			rangeStreamOn(t)
			paged[name](ctx, t, newCacher(t), noCalls)
		})
	}
	t.Run("Create", func(t *testing.T) {
		rangeStreamOn(t)
		c := newCacher(t)
		storagetesting.RunTestCreate(ctx, t, c, func(ctx context.Context, t *testing.T, key string) {
			// The cache passes creates to the store: the object must be in etcd, through the target.
			resp, err := c.store.client.KV.Get(ctx, c.store.etcdKey(key))
			if err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("get %s through the target: %v, %d keys", c.store.etcdKey(key), err, len(resp.Kvs))
			}
		})
	})
	t.Run("DeleteWithConflictAndMissingExpectedTransformOrDecodeError", func(t *testing.T) {
		rangeStreamOn(t)
		unsafeDeletion(t, true)
		fail := &failSwitch{}
		c := newCacher(t, cacherStore(withTransformer(switchTransformer{Transformer: identity.NewEncryptCheckTransformer(), failSwitch: fail})))
		storagetesting.RunTestDeleteWithConflictAndMissingExpectedTransformOrDecodeError(ctx, t, c, fail.set)
	})
	t.Run("DeleteWithConflictAndExpectedTransformError", func(t *testing.T) {
		rangeStreamOn(t)
		unsafeDeletion(t, true)
		fail := &failSwitch{}
		c := newCacher(t, cacherStore(withTransformer(switchTransformer{Transformer: identity.NewEncryptCheckTransformer(), failSwitch: fail})))
		storagetesting.RunTestDeleteExpectedTransformOrDecodeError(ctx, t, c, fail.set)
	})
	t.Run("DeleteWithConflictAndExpectedDecodeError", func(t *testing.T) {
		rangeStreamOn(t)
		unsafeDeletion(t, true)
		// Decode errors are fatal in tests unless turned off; this one decodes undecodable bytes on purpose.
		etcd3.TestOnlySetFatalOnDecodeError(t, false)
		fail := &failSwitch{}
		c := newCacher(t, cacherStore(withCodec(switchCodec{Codec: jsonCodec(), failSwitch: fail})))
		storagetesting.RunTestDeleteExpectedTransformOrDecodeError(ctx, t, c, fail.set)
	})
	t.Run("DeleteWithSuggestionAndMissingExpectedTransformOrDecodeError", func(t *testing.T) {
		rangeStreamOn(t)
		unsafeDeletion(t, true)
		storagetesting.RunTestDeleteWithSuggestionAndMissingExpectedTransformOrDecodeError(ctx, t, newCacher(t))
	})
	for _, snapshot := range []bool{true, false} {
		t.Run(fmt.Sprintf("ListFromCacheSnapshot=%v", snapshot), func(t *testing.T) {
			featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ListFromCacheSnapshot, snapshot)
			t.Run("List", func(t *testing.T) {
				if !snapshot {
					harness.Get(t)
					t.Skip("without cache snapshots, exact-revision lists go to etcd, and the suite expects those " +
						"requests at the revisions of a fresh etcd (the first write at revision 2); the runner's etcd " +
						"has served the earlier tests. The same lists through the store alone run in TestStore/List")
				}
				rangeStreamOn(t)
				// The suite expects the keys of the requests it records under the prefix Kubernetes' tests use.
				c := newCacher(t, cacherStore(withFixedPrefix("/registry/")))
				storagetesting.RunTestList(ctx, t, c, c.compaction(), true, c.store.lists)
			})
			t.Run("ConsistentList", func(t *testing.T) {
				rangeStreamOn(t)
				c := newCacher(t)
				storagetesting.RunTestConsistentList(ctx, t, c, c.store.increaseRV(), true, true, snapshot)
			})
			t.Run("GetListNonRecursive", func(t *testing.T) {
				rangeStreamOn(t)
				c := newCacher(t)
				storagetesting.RunTestGetListNonRecursive(ctx, t, c.store.increaseRV(), c)
			})
		})
	}
	t.Run("CompactRevision", func(t *testing.T) {
		featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ListFromCacheSnapshot, true)
		rangeStreamOn(t)
		c := newCacher(t)
		storagetesting.RunTestCompactRevision(ctx, t, c, c.store.increaseRV(), c.compaction())
	})
	t.Run("NamespaceScopedList", func(t *testing.T) {
		rangeStreamOn(t)
		storagetesting.RunTestNamespaceScopedList(ctx, t, newCacher(t, nodeNameAndNamespaceIndex))
	})
	for _, sizeBased := range []bool{true, false} {
		t.Run(fmt.Sprintf("Stats/SizeBasedListCostEstimate=%v", sizeBased), func(t *testing.T) {
			featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.SizeBasedListCostEstimate, sizeBased)
			rangeStreamOn(t)
			storagetesting.RunTestStats(ctx, t, newCacher(t), exampleProtoCodec, identity.NewEncryptCheckTransformer(), sizeBased)
		})
	}

	watches := map[string]func(context.Context, *testing.T, storage.Interface){
		"Watch":                                    storagetesting.RunTestWatch,
		"DeleteTriggerWatch":                       storagetesting.RunTestDeleteTriggerWatch,
		"WatchFromNonZero":                         storagetesting.RunTestWatchFromNonZero,
		"DelayedWatchDelivery":                     storagetesting.RunTestDelayedWatchDelivery,
		"WatcherTimeout":                           storagetesting.RunTestWatcherTimeout,
		"WatchDeleteEventObjectHaveLatestRV":       storagetesting.RunTestWatchDeleteEventObjectHaveLatestRV,
		"WatchInitializationSignal":                storagetesting.RunTestWatchInitializationSignal,
		"WatchBookmarksWithCorrectResourceVersion": storagetesting.RunTestOptionalWatchBookmarksWithCorrectResourceVersion,
		"SendInitialEventsBackwardCompatibility":   storagetesting.RunSendInitialEventsBackwardCompatibility,
	}
	for _, name := range sortedKeys(watches) {
		t.Run("Watch/"+name, func(t *testing.T) {
			rangeStreamOn(t)
			watches[name](ctx, t, newCacher(t))
		})
	}
	t.Run("Watch/ClusterScopedWatch", func(t *testing.T) {
		rangeStreamOn(t)
		storagetesting.RunTestClusterScopedWatch(ctx, t, newCacher(t, clusterScoped, nodeNameAndNamespaceIndex))
	})
	t.Run("Watch/NamespaceScopedWatch", func(t *testing.T) {
		rangeStreamOn(t)
		storagetesting.RunTestNamespaceScopedWatch(ctx, t, newCacher(t, nodeNameAndNamespaceIndex))
	})
	t.Run("Watch/WatchDispatchBookmarkEvents", func(t *testing.T) {
		rangeStreamOn(t)
		// The watch cache sends bookmarks: one must come.
		storagetesting.RunTestWatchDispatchBookmarkEvents(ctx, t, newCacher(t), true)
	})
	t.Run("Watch/WatchFromZero", func(t *testing.T) {
		harness.Get(t)
		t.Skip("Kubernetes compacts the watch cache's own history for this suite through the cacher's unexported " +
			"fields (compactWatch); there is no exported way to do it")
	})
	t.Run("Watch/WatchSemantics", func(t *testing.T) {
		rangeStreamOn(t)
		storagetesting.RunWatchSemantics(ctx, t, createThenSeen{newCacher(t)})
	})
	t.Run("Watch/WatchSemanticInitialEventsExtended", func(t *testing.T) {
		rangeStreamOn(t)
		storagetesting.RunWatchSemanticInitialEventsExtended(ctx, t, createThenSeen{newCacher(t)})
	})
	t.Run("Watch/WatchListMatchSingle", func(t *testing.T) {
		rangeStreamOn(t)
		storagetesting.RunWatchListMatchSingle(ctx, t, createThenSeen{newCacher(t)})
	})
}

// TestCacherConsistentListFromCache: a consistent list (no resourceVersion) of the watch cache is served from the
// cache, at a revision at least that of the latest write anywhere in etcd. The cache sees only its own prefix:
// it learns that it is current from a progress notification it requests on its watch stream, through the
// target. Without one it would fall back to listing etcd after a timeout, which the recorder would show.
func TestCacherConsistentListFromCache(t *testing.T) {
	rangeStreamOn(t)
	ctx := context.Background()
	c := newCacher(t)
	if !etcdfeature.DefaultFeatureSupportChecker.Supports(storage.RequestWatchProgress) {
		t.Fatal("RequestWatchProgress is not supported through the target")
	}
	for round := range 3 {
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("pod-%d", round)}}
		if err := c.Create(ctx, "/pods/ns/"+pod.Name, pod, &example.Pod{}, 0); err != nil {
			t.Fatal(err)
		}
		// A write outside the cache's prefix: the cache's watch never sees it.
		latest := c.store.increaseRV()(ctx, t)

		key := fmt.Sprintf("consistent-list-%d", round)
		listCtx := context.WithValue(ctx, storagetesting.RecorderContextKey, key)
		out := &example.PodList{}
		began := time.Now()
		if err := c.GetList(listCtx, "/pods/", storage.ListOptions{Predicate: storage.Everything, Recursive: true}, out); err != nil {
			t.Fatalf("consistent list: %v", err)
		}
		took := time.Since(began)
		if requests := c.store.lists.ListRequestForKey(key); len(requests) != 0 {
			t.Errorf("round %d: the consistent list went to etcd (%+v) instead of the cache", round, requests)
		}
		rv, err := storage.APIObjectVersioner{}.ParseResourceVersion(out.ResourceVersion)
		if err != nil {
			t.Fatal(err)
		}
		if int64(rv) < latest {
			t.Errorf("round %d: the consistent list is at revision %d, before the latest write at %d", round, rv, latest)
		}
		if len(out.Items) != round+1 {
			t.Errorf("round %d: the consistent list returned %d pods, want %d", round, len(out.Items), round+1)
		}
		t.Logf("round %d: consistent list from the cache at %d (latest write %d) in %v", round, rv, latest, took.Round(time.Millisecond))
	}
}
