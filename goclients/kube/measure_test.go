package kube

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	etcdfeature "k8s.io/apiserver/pkg/storage/feature"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"

	"etcdproxy.test/goclients/harness"
)

// measurePod is an example Pod of about a kibibyte stored, as a small real pod is.
func measurePod(i int) *example.Pod {
	grace, deadline := int64(30), int64(3600)
	return &example.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: fmt.Sprintf("ns-%02d", i%50),
			Name:      fmt.Sprintf("web-%05d", i),
			UID:       types.UID(fmt.Sprintf("2f1d3c8e-7a4b-4e0c-9d6f-%012d", i)),
			Labels: map[string]string{
				"app": "web", "tier": "frontend", "pod-template-hash": "6d4cf56db6",
				"app.kubernetes.io/version": "1.27.3", "app.kubernetes.io/managed-by": "helm",
			},
			Annotations: map[string]string{
				"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 280),
			},
		},
		Spec: example.PodSpec{
			RestartPolicy:                 "Always",
			TerminationGracePeriodSeconds: &grace,
			ActiveDeadlineSeconds:         &deadline,
			NodeSelector:                  map[string]string{"kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "m5.large"},
			ServiceAccountName:            "web",
			NodeName:                      fmt.Sprintf("node-%03d", i%100),
			Hostname:                      fmt.Sprintf("web-%05d", i),
			SchedulerName:                 "default-scheduler",
		},
		Status: example.PodStatus{
			Phase:   "Running",
			HostIP:  fmt.Sprintf("10.0.%d.%d", i%100, i%250),
			PodIP:   fmt.Sprintf("10.244.%d.%d", i/250%250, i%250),
			Message: "",
		},
	}
}

// TestMeasureList10000 (GOCLIENTS_MEASURE=1): times a recursive list of 10,000 pods of about 1 KiB through the
// store, with EtcdRangeStream on and off (paged), and logs the minimum and median of several lists each.
func TestMeasureList10000(t *testing.T) {
	env := harness.Get(t)
	if os.Getenv("GOCLIENTS_MEASURE") != "1" {
		t.Skip("a measurement: runs with GOCLIENTS_MEASURE=1")
	}
	const (
		objects = 10000
		reps    = 7
	)
	ctx := context.Background()
	s := newStore(t)

	encoded, err := runtime.Encode(s.codec, measurePod(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("each pod is %d bytes stored", len(encoded)+len(transformerPrefix))

	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= objects {
					return
				}
				pod := measurePod(i)
				if err := s.Create(ctx, fmt.Sprintf("/pods/%s/%s", pod.Namespace, pod.Name), pod, &example.Pod{}, 0); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("create: %v", err)
	}
	t.Logf("created %d pods in %v", objects, time.Since(start).Round(time.Millisecond))

	for _, stream := range []bool{true, false} {
		featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.EtcdRangeStream, stream)
		resetFeatureSupportChecker(t)
		s.kv.GetStreamReadsAndReset()
		s.kv.GetReadsAndReset()
		var times []time.Duration
		for range reps {
			out := &example.PodList{}
			began := time.Now()
			if err := s.GetList(ctx, "/pods/", storage.ListOptions{Predicate: storage.Everything, Recursive: true}, out); err != nil {
				t.Fatalf("list (stream=%v): %v", stream, err)
			}
			times = append(times, time.Since(began))
			if len(out.Items) != objects {
				t.Fatalf("list (stream=%v) returned %d pods, want %d", stream, len(out.Items), objects)
			}
		}
		served := "paged"
		if stream && etcdfeature.DefaultFeatureSupportChecker.Supports(storage.RangeStream) {
			served = "stream"
		}
		streams, reads := s.kv.GetStreamReadsAndReset(), s.kv.GetReadsAndReset()
		if served == "stream" && (streams != reps || reads != 0) {
			t.Errorf("streamed lists sent %d streams and %d unary ranges; want %d and 0", streams, reads, reps)
		}
		if served == "paged" && reads < reps {
			t.Errorf("paged lists sent %d unary ranges for %d lists", reads, reps)
		}
		slices.Sort(times)
		ms := func(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }
		gate := "off"
		if stream {
			gate = "on"
		}
		t.Logf("measure list10000 target=%s version=%s stream=%s served=%s reps=%d min=%s median=%s max=%s",
			env.Name(), env.Version, gate, served, reps, ms(times[0]), ms(times[len(times)/2]), ms(times[len(times)-1]))
	}
}
