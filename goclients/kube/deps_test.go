package kube

// Placeholder that keeps the storage layer's modules in go.mod until the suites land.
import (
	_ "go.etcd.io/etcd/client/v3/concurrency"
	_ "go.etcd.io/etcd/client/v3/leasing"
	_ "go.etcd.io/etcd/client/v3/naming/resolver"
	_ "k8s.io/apiserver/pkg/storage/cacher"
	_ "k8s.io/apiserver/pkg/storage/etcd3"
	_ "k8s.io/apiserver/pkg/storage/testing"
	_ "k8s.io/component-base/featuregate/testing"
)
