//go:build tools

// The Kubernetes binaries the scenario runs, built from this module's
// k8s.io/kubernetes, and kubeadm, whose etcd static-pod manifest
// TestKubeadmManifest runs on cairn.
package kubernetes

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubeadm"
)
