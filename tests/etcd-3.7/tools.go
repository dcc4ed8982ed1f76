//go:build tools

// Package tools pins the etcd 3.7 main packages so that `go mod tidy`
// keeps them (and their whole dependency graph) in go.mod / go.sum.
package tools

import (
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "go.etcd.io/etcd/etcdutl/v3"
	_ "go.etcd.io/etcd/server/v3"
)
