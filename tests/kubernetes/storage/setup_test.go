package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.uber.org/zap"
	"google.golang.org/grpc/grpclog"

	"k8s.io/apimachinery/pkg/api/apitesting"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	etcdfeature "k8s.io/apiserver/pkg/storage/feature"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/utils/clock"
)

var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

const (
	// valuePrefix is what the PrefixTransformer puts in front of every stored
	// value (the etcd3 tests' defaultTestPrefix).
	valuePrefix = "test!"
	// etcdMaxLimit mirrors etcd3's unexported maxLimit (largest page it asks for).
	etcdMaxLimit = 10000
)

func init() {
	metav1.AddToGroupVersion(scheme, metav1.SchemeGroupVersion)
	utilruntime.Must(example.AddToScheme(scheme))
	utilruntime.Must(examplev1.AddToScheme(scheme))
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, os.Stderr))
}

// swapTransformer is the value.Transformer handed to etcd3.New. The etcd3 tests
// swap the store's (unexported) transformer field; from outside the package we
// get the same effect by delegating to a replaceable inner transformer, which
// both the store and its watcher read on every call.
type swapTransformer struct {
	mu    sync.RWMutex
	inner value.Transformer
}

func (s *swapTransformer) get() value.Transformer {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.inner
}

func (s *swapTransformer) set(t value.Transformer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inner = t
}

func (s *swapTransformer) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, bool, error) {
	return s.get().TransformFromStorage(ctx, data, dataCtx)
}

func (s *swapTransformer) TransformToStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, error) {
	return s.get().TransformToStorage(ctx, data, dataCtx)
}

// storeWithPrefixTransformer implements storagetesting.InterfaceWithPrefixTransformer.
type storeWithPrefixTransformer struct {
	storage.Interface
	transformer *swapTransformer
}

func (s *storeWithPrefixTransformer) UpdatePrefixTransformer(modifier storagetesting.PrefixTransformerModifier) func() {
	orig := s.transformer.get()
	cp := *orig.(*storagetesting.PrefixTransformer)
	s.transformer.set(modifier(&cp))
	return func() { s.transformer.set(orig) }
}

// storeWithTransformerOverride implements storagetesting.InterfaceWithTransformerOverride.
type storeWithTransformerOverride struct {
	storage.Interface
	transformer *swapTransformer
}

func (s *storeWithTransformerOverride) UpdateTransformer(modifier storagetesting.TransformerModifier) func() {
	orig := s.transformer.get()
	s.transformer.set(modifier(orig))
	return func() { s.transformer.set(orig) }
}

// failingTransformer makes the store's transform fail on demand.
type failingTransformer struct {
	value.Transformer
	fail atomic.Bool
}

func (f *failingTransformer) setFailing(b bool) { f.fail.Store(b) }

func (f *failingTransformer) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, bool, error) {
	if f.fail.Load() {
		return nil, false, errors.New("synthetic error")
	}
	return f.Transformer.TransformFromStorage(ctx, data, dataCtx)
}

// failingCodec makes the store's decode fail on demand.
type failingCodec struct {
	runtime.Codec
	fail atomic.Bool
}

func (c *failingCodec) setFailing(b bool) { c.fail.Store(b) }

func (c *failingCodec) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if c.fail.Load() {
		return nil, nil, errors.New("synthetic error")
	}
	return c.Codec.Decode(data, defaults, into)
}

type errTransformer struct{ err error }

func (e errTransformer) TransformFromStorage(context.Context, []byte, value.Context) ([]byte, bool, error) {
	return nil, false, e.err
}
func (e errTransformer) TransformToStorage(context.Context, []byte, value.Context) ([]byte, error) {
	return nil, e.err
}

// corruptObjectError returns the etcd3 package's (unexported) corrupt-object
// error for an untransformable value, the same value the etcd3 tests build
// with &corruptObjectError{err: fmt.Errorf("bits flipped"), errType: untransformable}.
func corruptObjectError() error {
	tr := etcd3.WithCorruptObjErrorHandlingTransformer(errTransformer{err: fmt.Errorf("bits flipped")})
	_, _, err := tr.TransformFromStorage(context.Background(), nil, value.DefaultContext{})
	return err
}

// env is one etcd3 store on its own key prefix, with its own client.
type env struct {
	ctx               context.Context
	store             storage.Interface
	client            *kubernetes.Client
	kv                *storagetesting.KVRecorder
	lists             *storagetesting.KubernetesRecorder
	transformer       *swapTransformer
	prefixTransformer *storagetesting.PrefixTransformer
	codec             runtime.Codec
	prefix            string // store path prefix (always ends in "/")
}

type setupOptions struct {
	codec    runtime.Codec
	prefixFn func(*storagetesting.PrefixTransformer) value.Transformer // wraps the PrefixTransformer
	noPrefix bool                                                      // keys at the server's root
}

type setupOption func(*setupOptions)

func withCodec(c runtime.Codec) setupOption { return func(o *setupOptions) { o.codec = c } }

// withoutKeyPrefix puts the store at the server's root (the etcd3 tests'
// prefix ""), for the subtests whose assertions spell out full etcd keys; they
// run on a server of their own.
func withoutKeyPrefix() setupOption { return func(o *setupOptions) { o.noPrefix = true } }

func withTransformer(f func(*storagetesting.PrefixTransformer) value.Transformer) setupOption {
	return func(o *setupOptions) { o.prefixFn = f }
}

var nonKeyChars = regexp.MustCompile(`[^A-Za-z0-9_.=-]+`)

// keyPrefixFor gives every (sub)test its own key prefix on the shared server.
func keyPrefixFor(t testing.TB) string {
	return "/" + nonKeyChars.ReplaceAllString(t.Name(), "_") + "/"
}

func newClient(t testing.TB, srv *serverProcess) *kubernetes.Client {
	t.Helper()
	c, err := kubernetes.New(clientv3.Config{
		Endpoints:   []string{srv.clientURL},
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("connecting to %s: %v", srv.clientURL, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// testSetup builds an etcd3 store on a fresh clientv3 client to srv, the way
// k8s.io/apiserver/pkg/storage/etcd3's testSetup does with its embedded etcd,
// but with a per-test key prefix.
func testSetup(t *testing.T, srv *serverProcess, opts ...setupOption) *env {
	t.Helper()
	o := setupOptions{codec: apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion)}
	for _, opt := range opts {
		opt(&o)
	}
	client := newClient(t, srv)
	lists := storagetesting.NewKubernetesRecorder(client.Kubernetes)
	kv := storagetesting.NewKVRecorder(client.KV, lists)
	client.KV = kv
	client.Kubernetes = lists

	prefixTransformer := storagetesting.NewPrefixTransformer([]byte(valuePrefix), false)
	var inner value.Transformer = prefixTransformer
	if o.prefixFn != nil {
		inner = o.prefixFn(prefixTransformer)
	}
	transformer := &swapTransformer{inner: inner}

	leaseConfig := etcd3.NewDefaultLeaseManagerConfig()
	leaseConfig.ReuseDurationSeconds = 1 // as the etcd3 tests do

	versioner := storage.APIObjectVersioner{}
	compactor := etcd3.NewCompactor(client.Client, 0, clock.RealClock{}, nil)
	t.Cleanup(compactor.Stop)
	prefix := keyPrefixFor(t)
	if o.noPrefix {
		prefix = "/"
	}
	s, err := etcd3.New(
		client,
		compactor,
		o.codec,
		func() runtime.Object { return &example.Pod{} },
		func() runtime.Object { return &example.PodList{} },
		prefix,
		"/pods/",
		schema.GroupResource{Resource: "pods"},
		transformer,
		leaseConfig,
		etcd3.NewDefaultDecoder(o.codec, versioner),
		versioner,
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return &env{
		ctx:               context.Background(),
		store:             s,
		client:            client,
		kv:                kv,
		lists:             lists,
		transformer:       transformer,
		prefixTransformer: prefixTransformer,
		codec:             o.codec,
		prefix:            prefix,
	}
}

func (e *env) withPrefixTransformer() storagetesting.InterfaceWithPrefixTransformer {
	return &storeWithPrefixTransformer{Interface: e.store, transformer: e.transformer}
}

func (e *env) withTransformerOverride(s storage.Interface) storagetesting.InterfaceWithTransformerOverride {
	return &storeWithTransformerOverride{Interface: s, transformer: e.transformer}
}

// checkStorageInvariants reads the raw value behind key straight from the
// server and checks what the store wrote (etcd3 tests' checkStorageInvariants).
func (e *env) checkStorageInvariants() storagetesting.KeyValidation {
	return func(ctx context.Context, t *testing.T, key string) {
		full := e.prefix + trimSlash(key)
		getResp, err := e.client.KV.Get(ctx, full)
		if err != nil {
			t.Fatalf("etcdClient.KV.Get failed: %v", err)
		}
		if len(getResp.Kvs) == 0 {
			t.Fatalf("expecting non empty result on key: %s", full)
		}
		decoded, err := runtime.Decode(e.codec, getResp.Kvs[0].Value[len(valuePrefix):])
		if err != nil {
			t.Fatalf("expecting successful decode of object from %v\n%v", err, string(getResp.Kvs[0].Value))
		}
		obj := decoded.(*example.Pod)
		if obj.ResourceVersion != "" {
			t.Errorf("stored object should have empty resource version")
		}
		if obj.SelfLink != "" {
			t.Errorf("stored output should have empty selfLink")
		}
	}
}

func trimSlash(s string) string {
	if len(s) > 0 && s[0] == '/' {
		return s[1:]
	}
	return s
}

// increaseRV bumps the server's revision with an unrelated write.
func (e *env) increaseRV() storagetesting.IncreaseRVFunc {
	return func(ctx context.Context, t *testing.T) int64 {
		resp, err := e.client.KV.Put(ctx, "increaseRV", "ok")
		if err != nil {
			t.Fatalf("Could not update increaseRV: %v", err)
		}
		return resp.Header.Revision
	}
}

// compaction compacts the server at resourceVersion the way kube-apiserver's
// compactor does (etcd3.Compact: CAS on compact_rev_key, then a clientv3
// Compact), then, with ListFromCacheSnapshot on, waits until the store's
// compactor has observed it.
func (e *env) compaction() storagetesting.Compaction {
	return func(ctx context.Context, t *testing.T, resourceVersion string) {
		rv, err := strconv.ParseInt(resourceVersion, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		var version int64
		compacted := false
		for attempt := 0; attempt < 5 && !compacted; attempt++ {
			var compactRev int64
			version, _, compactRev, err = etcd3.Compact(ctx, e.client.Client, version, rv)
			if err != nil {
				continue
			}
			// A lost CAS returns the key's current version and no error: retry with it.
			compacted = compactRev == rv
		}
		if !compacted {
			t.Fatalf("compacting at %d failed: %v", rv, err)
		}
		if utilfeature.DefaultFeatureGate.Enabled(features.ListFromCacheSnapshot) {
			deadline := time.After(30 * time.Second)
			for e.store.CompactRevision() != rv {
				select {
				case <-deadline:
					t.Fatalf("store did not observe compaction at %d (has %d)", rv, e.store.CompactRevision())
				case <-time.After(100 * time.Millisecond):
				}
			}
		}
	}
}

// checkStorageCallsInvariants is the etcd3 tests' call-count validation: the
// number of values transformed and the number of range requests sent.
func (e *env) checkStorageCallsInvariants() storagetesting.CallsValidation {
	return func(t *testing.T, pageSize, estimatedProcessedObjects uint64) {
		if reads := e.prefixTransformer.GetReadsAndReset(); reads != estimatedProcessedObjects {
			t.Errorf("unexpected reads: %d, expected: %d", reads, estimatedProcessedObjects)
		}
		estimatedGetCalls := uint64(1)
		if pageSize != 0 {
			currLimit := pageSize
			for sum := uint64(1); sum < estimatedProcessedObjects; {
				currLimit *= 2
				if currLimit > etcdMaxLimit {
					currLimit = etcdMaxLimit
				}
				sum += currLimit
				estimatedGetCalls++
			}
		}
		if reads := e.kv.GetReadsAndReset() + e.kv.GetStreamReadsAndReset(); reads != estimatedGetCalls {
			t.Fatalf("unexpected reads: %d, want: %d", reads, estimatedGetCalls)
		}
	}
}

// getKeys is the store's KeysFunc for resource size estimation (etcd3's
// unexported store.getKeys): every key under <prefix>pods/.
func (e *env) getKeys(ctx context.Context) ([]string, error) {
	resp, err := e.client.KV.Get(ctx, e.prefix+"pods/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	return keys, nil
}

// resetFeatureSupportChecker gives the test a fresh etcd feature checker (a
// RangeStream fallback marks the feature unsupported process-wide).
func resetFeatureSupportChecker(t *testing.T) {
	t.Helper()
	orig := etcdfeature.DefaultFeatureSupportChecker
	etcdfeature.DefaultFeatureSupportChecker = etcdfeature.NewDefaultFeatureSupportChecker()
	t.Cleanup(func() { etcdfeature.DefaultFeatureSupportChecker = orig })
}
