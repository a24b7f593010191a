package kube

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	etcdfeature "k8s.io/apiserver/pkg/storage/feature"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
)

// failSwitch makes a transformer or a codec fail on reads while it is on.
type failSwitch struct{ on atomic.Bool }

func (f *failSwitch) set(on bool) { f.on.Store(on) }

type switchTransformer struct {
	value.Transformer
	*failSwitch
}

func (s switchTransformer) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, bool, error) {
	if s.on.Load() {
		return nil, false, errSynthetic
	}
	return s.Transformer.TransformFromStorage(ctx, data, dataCtx)
}

type switchCodec struct {
	runtime.Codec
	*failSwitch
}

func (s switchCodec) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if s.on.Load() {
		return nil, nil, errSynthetic
	}
	return s.Codec.Decode(data, defaults, into)
}

// storeCallsValidation checks how many objects the store read (transformed) and how many range requests (unary
// or stream) it sent through the target for a paged list, as Kubernetes expects (page sizes double up to the
// store's maximum of 10000).
func storeCallsValidation(s *testStore) storagetesting.CallsValidation {
	const maxLimit = 10000
	return func(t *testing.T, pageSize, estimatedProcessedObjects uint64) {
		if reads := s.base.GetReadsAndReset(); reads != estimatedProcessedObjects {
			t.Errorf("the store transformed %d objects, want %d", reads, estimatedProcessedObjects)
		}
		want := uint64(1)
		if pageSize != 0 {
			limit := pageSize
			for sum := uint64(1); sum < estimatedProcessedObjects; {
				limit = min(limit*2, maxLimit)
				sum += limit
				want++
			}
		}
		reads, streams := s.kv.GetReadsAndReset(), s.kv.GetStreamReadsAndReset()
		if !etcdfeature.DefaultFeatureSupportChecker.Supports(storage.RangeStream) {
			// etcd refused the RangeStream (Unimplemented: etcd before 3.7, directly) and unary ranges served the
			// list: that refused probe is the one stream request there may be.
			if streams > 1 {
				t.Errorf("the store asked %d times for a RangeStream etcd does not have", streams)
			}
			streams = 0
		}
		if got := reads + streams; got != want {
			t.Fatalf("the store sent %d range requests (%d unary, %d stream), want %d", got, reads, streams, want)
		}
	}
}

func unsafeDeletion(t *testing.T, on bool) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.AllowUnsafeMalformedObjectDeletion, on)
}

// TestStore runs the generic storage suites (k8s.io/apiserver/pkg/storage/testing, store_tests.go) over an etcd3
// store whose client talks to the target, as Kubernetes runs them over its etcd3 store.
func TestStore(t *testing.T) {
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
		"KeySchema":                                 storagetesting.RunTestKeySchema,
		"GuaranteedUpdateWithTTL":                   storagetesting.RunTestGuaranteedUpdateWithTTL,
		"GuaranteedUpdateWithConflict":              storagetesting.RunTestGuaranteedUpdateWithConflict,
		"GuaranteedUpdateWithSuggestionAndConflict": storagetesting.RunTestGuaranteedUpdateWithSuggestionAndConflict,
		"NamespaceScopedList":                       storagetesting.RunTestNamespaceScopedList,
	}
	for _, name := range sortedKeys(plain) {
		t.Run(name, func(t *testing.T) {
			s := newStore(t)
			plain[name](ctx, t, s)
		})
	}

	t.Run("Create", func(t *testing.T) {
		s := newStore(t)
		storagetesting.RunTestCreate(ctx, t, s, s.checkStoredObject())
	})
	t.Run("DeleteWithConflictAndMissingExpectedTransformOrDecodeError", func(t *testing.T) {
		unsafeDeletion(t, true)
		fail := &failSwitch{}
		s := newStore(t, withCodec(switchCodec{Codec: jsonCodec(), failSwitch: fail}))
		storagetesting.RunTestDeleteWithConflictAndMissingExpectedTransformOrDecodeError(ctx, t, s, fail.set)
	})
	t.Run("DeleteWithConflictAndExpectedTransformError", func(t *testing.T) {
		unsafeDeletion(t, true)
		fail := &failSwitch{}
		base := storagetesting.NewPrefixTransformer([]byte(transformerPrefix), false)
		s := newStore(t, withTransformer(switchTransformer{Transformer: base, failSwitch: fail}))
		storagetesting.RunTestDeleteExpectedTransformOrDecodeError(ctx, t, s, fail.set)
	})
	t.Run("DeleteWithConflictAndExpectedDecodeError", func(t *testing.T) {
		unsafeDeletion(t, true)
		fail := &failSwitch{}
		s := newStore(t, withCodec(switchCodec{Codec: jsonCodec(), failSwitch: fail}))
		storagetesting.RunTestDeleteExpectedTransformOrDecodeError(ctx, t, s, fail.set)
	})
	t.Run("DeleteWithSuggestionAndMissingExpectedTransformOrDecodeFailure", func(t *testing.T) {
		unsafeDeletion(t, true)
		storagetesting.RunTestDeleteWithSuggestionAndMissingExpectedTransformOrDecodeError(ctx, t, newStore(t))
	})
	t.Run("GetListNonRecursive", func(t *testing.T) {
		s := newStore(t)
		storagetesting.RunTestGetListNonRecursive(ctx, t, s.increaseRV(), s)
	})
	t.Run("GetListWithErrorAggregation", func(t *testing.T) {
		unsafeDeletion(t, true)
		s := newStore(t, withFixedPrefix("/"))
		deleter := etcd3.NewStoreWithUnsafeCorruptObjectDeletion(s, schema.GroupResource{Resource: "pods"})
		storagetesting.RunTestGetListWithErrorAggregation(ctx, t, overridable{Interface: deleter, store: s}, corruptObjectError(fmt.Errorf("bits flipped")))
	})
	t.Run("GetListWithoutErrorAggregation", func(t *testing.T) {
		unsafeDeletion(t, false)
		s := newStore(t, withFixedPrefix("/"))
		storagetesting.RunTestGetListWithoutErrorAggregation(ctx, t, overridable{Interface: s, store: s}, corruptObjectError(fmt.Errorf("bits flipped")))
	})
	t.Run("GuaranteedUpdate", func(t *testing.T) {
		s := newStore(t)
		storagetesting.RunTestGuaranteedUpdate(ctx, t, s, s.checkStoredObject())
	})
	t.Run("GuaranteedUpdateChecksStoredData", func(t *testing.T) {
		storagetesting.RunTestGuaranteedUpdateChecksStoredData(ctx, t, newStore(t))
	})
	t.Run("TransformationFailure", func(t *testing.T) {
		storagetesting.RunTestTransformationFailure(ctx, t, newStore(t))
	})
	t.Run("ListResourceVersionMatch", func(t *testing.T) {
		storagetesting.RunTestListResourceVersionMatch(ctx, t, newStore(t))
	})
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("List/rangeStream=%v", stream), func(t *testing.T) {
			featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.EtcdRangeStream, stream)
			s := newStore(t)
			storagetesting.RunTestList(ctx, t, s, s.compaction(), false, s.lists)
			streams := s.kv.GetStreamReadsAndReset()
			if stream && streams == 0 {
				t.Error("with EtcdRangeStream on, no list asked for a RangeStream")
			}
			if !stream && streams > 0 {
				t.Errorf("with EtcdRangeStream off, %d lists asked for a RangeStream", streams)
			}
		})
		t.Run(fmt.Sprintf("ConsistentList/rangeStream=%v", stream), func(t *testing.T) {
			featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.EtcdRangeStream, stream)
			s := newStore(t)
			storagetesting.RunTestConsistentList(ctx, t, s, s.increaseRV(), false, true, false)
		})
	}
	t.Run("CompactRevision", func(t *testing.T) {
		// The store sees compactions by others through a watch of compact_rev_key, which ListFromCacheSnapshot turns on.
		featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ListFromCacheSnapshot, true)
		s := newStore(t)
		storagetesting.RunTestCompactRevision(ctx, t, s, s.increaseRV(), s.compaction())
	})
	t.Run("ListContinuation", func(t *testing.T) {
		s := newStore(t)
		storagetesting.RunTestListContinuation(ctx, t, s, storeCallsValidation(s))
	})
	t.Run("ListPaginationRareObject", func(t *testing.T) {
		// ListFromCacheSnapshot adds a read of compact_rev_key that the count of range requests does not expect.
		featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ListFromCacheSnapshot, false)
		s := newStore(t)
		storagetesting.RunTestListPaginationRareObject(ctx, t, s, storeCallsValidation(s))
	})
	t.Run("ListContinuationWithFilter", func(t *testing.T) {
		s := newStore(t)
		storagetesting.RunTestListContinuationWithFilter(ctx, t, s, storeCallsValidation(s))
	})
	t.Run("ListInconsistentContinuation", func(t *testing.T) {
		s := newStore(t)
		storagetesting.RunTestListInconsistentContinuation(ctx, t, s, s.compaction())
	})
	for _, sizeBased := range []bool{true, false} {
		t.Run(fmt.Sprintf("Stats/SizeBasedListCostEstimate=%v", sizeBased), func(t *testing.T) {
			s := newStore(t)
			if sizeBased {
				if err := s.EnableResourceSizeEstimation(s.getKeys); err != nil {
					t.Fatal(err)
				}
			}
			storagetesting.RunTestStats(ctx, t, s, s.codec, s.base, sizeBased)
		})
	}
	t.Run("GetCurrentResourceVersion", func(t *testing.T) {
		s := newStore(t)
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pod-1"}}
		out := &example.Pod{}
		if err := s.Create(ctx, "/pods/ns/pod-1", pod, out, 0); err != nil {
			t.Fatal(err)
		}
		current, err := s.GetCurrentResourceVersion(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(current); got != out.ResourceVersion {
			t.Errorf("GetCurrentResourceVersion = %s right after a create at %s", got, out.ResourceVersion)
		}
		rev := s.increaseRV()(ctx, t)
		if current, err = s.GetCurrentResourceVersion(ctx); err != nil {
			t.Fatal(err)
		}
		if int64(current) != rev {
			t.Errorf("GetCurrentResourceVersion = %d after an unrelated write at %d", current, rev)
		}
	})
}
