// The etcd server (and its `grpc-proxy start`, etcd's Go proxy) of the version this module's go.mod requires.
// etcd's own main package cannot be installed with `go install module@version` (its go.mod has replace
// directives), so this one calls its entry point.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
