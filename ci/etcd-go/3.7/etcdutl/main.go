// etcdutl built from etcd's module: the administrative commands etcd exports, under one root command.
package main

import (
	"os"

	"github.com/spf13/cobra"

	"go.etcd.io/etcd/etcdutl/v3/etcdutl"
)

func main() {
	root := &cobra.Command{Use: "etcdutl", Short: "etcd's administrative tool, built from its Go module"}
	root.PersistentFlags().StringVarP(&etcdutl.OutputFormat, "write-out", "w", "simple", "output format (fields, json, protobuf, simple, table)")
	root.AddCommand(
		etcdutl.NewDefragCommand(),
		etcdutl.NewSnapshotCommand(),
		etcdutl.NewHashKVCommand(),
		etcdutl.NewVersionCommand(),
		etcdutl.NewMigrateCommand(),
	)
	if err := root.Execute(); err != nil {
		os.Exit(1)
	}
}
