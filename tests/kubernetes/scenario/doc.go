// Package scenario runs a real kube-apiserver, kube-controller-manager and
// kube-scheduler against a three-member cairn cluster and drives them with
// client-go through a fixed scenario (see ../README.md). TestScenario runs
// cairn in plaintext; TestScenarioMTLS runs part of the scenario against
// members set up as kubeadm sets up etcd (its certificate layout and flags,
// mutual TLS on the client and peer ports) and checks that certificates from
// another CA are refused. TestMoveFromEtcd moves a running kube-apiserver
// from an etcd cluster to a cairn cluster and checks that no watch starts
// over. TestKubeadmManifest has kubeadm write its etcd static-pod manifest,
// runs that manifest's command unchanged with cairn as `etcd`, and runs the
// single-member steps on kube-apiserver on top of it.
//
// Environment:
//
//	CAIRN_BIN     path to the cairn binary (required, else the test skips)
//	KUBE_BIN_DIR  directory holding kube-apiserver, kube-controller-manager,
//	              kube-scheduler (required, else the test skips), and kubeadm
//	              (else TestKubeadmManifest skips)
//	ETCD_BIN      path to the etcd binary that TestMoveFromEtcd moves
//	              kube-apiserver from (else that test skips)
//	KUBE_VERSION  label of the Kubernetes release, e.g. 1.37 or 1.34; steps
//	              that only apply to some releases key off it
//	SCENARIO_KEEP_LOGS=1  keep the log directory even when the test passes
package scenario
