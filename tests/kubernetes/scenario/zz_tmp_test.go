package scenario

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cairn-kv/cairn/tests/kubernetes/internal/controlplane"
)

func TestTmpCairnTLS(t *testing.T) {
	dir := t.TempDir()
	h := &harness{dir: dir}
	var err error
	s := time.Now()
	h.etcdPKI, err = controlplane.GenerateEtcdPKI(filepath.Join(dir, "pki"), memberNames)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pki %v", time.Since(s))
	s = time.Now()
	h.cairn, err = startCairnCluster(os.Getenv("CAIRN_BIN"), dir, h.etcdPKI)
	if err != nil {
		for _, m := range []string{"m1", "m2", "m3"} {
			t.Log(tailFile(filepath.Join(dir, "cairn-"+m+".log"), 20))
		}
		t.Fatal(err)
	}
	defer h.cairn.stop()
	t.Logf("healthy %v", time.Since(s))
	t.Run("tls", func(t *testing.T) { testMemberTLS(t, h) })
	t.Run("probes", func(t *testing.T) { testKubeadmProbes(t, h) })
	i, err := h.cairn.leader(context.Background())
	t.Log(i, err)
	if t.Failed() {
		for _, m := range []string{"m1", "m2", "m3"} {
			t.Log(tailFile(filepath.Join(dir, "cairn-"+m+".log"), 20))
		}
	}
}
