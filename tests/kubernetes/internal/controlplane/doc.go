// Package controlplane runs Kubernetes control-plane processes on this
// machine's loopback interface for the harnesses in tests/kubernetes: child
// processes with their output in log files ([Proc]), a throwaway PKI and admin
// token ([GeneratePKI]), kubeadm's etcd certificates ([GenerateEtcdPKI]), and
// kube-apiserver itself ([StartAPIServer]).
//
// It knows nothing about the storage behind kube-apiserver: the caller passes
// the etcd client URLs (cairn or etcd) and any flags of its own.
package controlplane
