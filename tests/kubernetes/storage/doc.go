// Package storage runs Kubernetes' storage conformance tests
// (k8s.io/apiserver/pkg/storage/testing) against an etcd3 store talking to a
// real cairn or etcd process. Everything is in the _test.go files; see README.md.
package storage
