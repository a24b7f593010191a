package clientv3

// Placeholder that keeps clientv3's helper packages in go.mod until this package's tests land.
import (
	_ "go.etcd.io/etcd/client/v3/concurrency"
	_ "go.etcd.io/etcd/client/v3/leasing"
	_ "go.etcd.io/etcd/client/v3/naming/resolver"
)
