package storage

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/api/apitesting"
	"k8s.io/apimachinery/pkg/runtime/schema"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage/etcd3"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
)

// serverKind says which server process a subtest runs against.
type serverKind int

const (
	// shared: the one server of the whole run; the subtest gets its own key prefix.
	shared serverKind = iota
	// fresh: a server of its own. For the subtests that compact (compaction is
	// global: it would break later subtests' watches from old revisions).
	fresh
	// progress: a server of its own started with a 1s watch progress-notify
	// interval (STORAGE_PROGRESS_FLAG, default --watch-progress-notify-interval=1s).
	progress
)

type suite struct {
	target, bin string
	owner       *testing.T

	mu      sync.Mutex
	shared  *serverProcess
	results *os.File
}

func (s *suite) server(t *testing.T, kind serverKind) *serverProcess {
	t.Helper()
	switch kind {
	case fresh:
		srv, err := startServer(t, s.target, s.bin)
		if err != nil {
			t.Fatal(err)
		}
		return srv
	case progress:
		flag := defaultProgressFlag
		if v, ok := os.LookupEnv(envProgressFlag); ok {
			flag = v
		}
		srv, err := startServer(t, s.target, s.bin, strings.Fields(flag)...)
		if err != nil {
			t.Fatalf("this test needs a server with a 1s watch progress-notify interval (%q): %v", flag, err)
		}
		return srv
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shared == nil || !s.shared.alive() {
		if s.shared != nil {
			t.Logf("shared %s server had exited; starting a new one", s.target)
		}
		srv, err := startServer(s.owner, s.target, s.bin)
		if err != nil {
			t.Fatal(err)
		}
		s.shared = srv
	}
	return s.shared
}

// run runs fn as subtest name against a server of the given kind and writes
// its result line (name<TAB>pass|fail|skip) to STORAGE_RESULTS.
func (s *suite) run(t *testing.T, name string, kind serverKind, fn func(t *testing.T, srv *serverProcess)) {
	t.Helper()
	var skipped bool
	var fullName string
	ok := t.Run(name, func(t *testing.T) {
		fullName = t.Name()
		defer func() { skipped = t.Skipped() }()
		srv := s.server(t, kind)
		defer func() {
			if !srv.alive() {
				t.Errorf("%s server exited during this test (%v); log tail:\n%s", s.target, srv.waitErr, srv.logTail(30))
			}
		}()
		fn(t, srv)
	})
	if fullName == "" {
		return // filtered out by -run: not run, not recorded
	}
	result := "pass"
	switch {
	case skipped:
		result = "skip"
	case !ok:
		result = "fail"
	}
	s.record(strings.TrimPrefix(fullName, s.owner.Name()+"/"), result)
}

func (s *suite) record(name, result string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.results == nil {
		return
	}
	fmt.Fprintf(s.results, "%s\t%s\n", name, result)
	s.results.Sync()
}

func setGate(t *testing.T, f featuregate.Feature, v bool) {
	t.Helper()
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, f, v)
}

// TestConformance runs the storage conformance functions of
// k8s.io/apiserver/pkg/storage/testing against an etcd3 store talking to a
// real server process (STORAGE_TARGET=cairn|etcd), wired like the etcd3
// package's own store_test.go and watcher_test.go.
func TestConformance(t *testing.T) {
	target, bin := targetBinary(t)
	s := &suite{target: target, bin: bin, owner: t}
	if path := os.Getenv(envResults); path != "" {
		f, err := os.Create(path)
		if err != nil {
			t.Fatalf("%s: %v", envResults, err)
		}
		defer f.Close()
		s.results = f
	}
	// Start the shared server now so that a server that cannot start fails fast.
	s.server(t, shared)

	// ---- store_test.go ----
	s.run(t, "Create", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestCreate(e.ctx, t, e.store, e.checkStorageInvariants())
	})
	s.run(t, "CreateWithTTL", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestCreateWithTTL(e.ctx, t, e.store)
	})
	s.run(t, "CreateWithKeyExist", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestCreateWithKeyExist(e.ctx, t, e.store)
	})
	s.run(t, "Get", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestGet(e.ctx, t, e.store)
	})
	s.run(t, "UnconditionalDelete", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestUnconditionalDelete(e.ctx, t, e.store)
	})
	s.run(t, "ConditionalDelete", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestConditionalDelete(e.ctx, t, e.store)
	})
	s.run(t, "DeleteWithSuggestion", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestDeleteWithSuggestion(e.ctx, t, e.store)
	})
	s.run(t, "DeleteWithSuggestionAndConflict", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestDeleteWithSuggestionAndConflict(e.ctx, t, e.store)
	})
	s.run(t, "DeleteWithSuggestionOfDeletedObject", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestDeleteWithSuggestionOfDeletedObject(e.ctx, t, e.store)
	})
	s.run(t, "ValidateDeletionWithSuggestion", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestValidateDeletionWithSuggestion(e.ctx, t, e.store)
	})
	s.run(t, "ValidateDeletionWithOnlySuggestionValid", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestValidateDeletionWithOnlySuggestionValid(e.ctx, t, e.store)
	})
	s.run(t, "DeleteWithConflict", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestDeleteWithConflict(e.ctx, t, e.store)
	})
	s.run(t, "DeleteWithConflictAndMissingExpectedTransformOrDecodeError", shared, func(t *testing.T, srv *serverProcess) {
		setGate(t, features.AllowUnsafeMalformedObjectDeletion, true)
		codec := &failingCodec{Codec: apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion)}
		e := testSetup(t, srv, withCodec(codec))
		storagetesting.RunTestDeleteWithConflictAndMissingExpectedTransformOrDecodeError(e.ctx, t, e.store, codec.setFailing)
	})
	s.run(t, "DeleteWithConflictAndExpectedTransformError", shared, func(t *testing.T, srv *serverProcess) {
		setGate(t, features.AllowUnsafeMalformedObjectDeletion, true)
		tr := &failingTransformer{}
		e := testSetup(t, srv, withTransformer(func(p *storagetesting.PrefixTransformer) value.Transformer {
			tr.Transformer = p
			return tr
		}))
		storagetesting.RunTestDeleteExpectedTransformOrDecodeError(e.ctx, t, e.store, tr.setFailing)
	})
	s.run(t, "DeleteWithConflictAndExpectedDecodeError", shared, func(t *testing.T, srv *serverProcess) {
		setGate(t, features.AllowUnsafeMalformedObjectDeletion, true)
		codec := &failingCodec{Codec: apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion)}
		e := testSetup(t, srv, withCodec(codec))
		storagetesting.RunTestDeleteExpectedTransformOrDecodeError(e.ctx, t, e.store, codec.setFailing)
	})
	s.run(t, "DeleteWithSuggestionAndMissingExpectedTransformOrDecodeFailure", shared, func(t *testing.T, srv *serverProcess) {
		setGate(t, features.AllowUnsafeMalformedObjectDeletion, true)
		e := testSetup(t, srv)
		storagetesting.RunTestDeleteWithSuggestionAndMissingExpectedTransformOrDecodeError(e.ctx, t, e.store)
	})
	s.run(t, "PreconditionalDeleteWithSuggestion", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestPreconditionalDeleteWithSuggestion(e.ctx, t, e.store)
	})
	s.run(t, "PreconditionalDeleteWithSuggestionPass", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestPreconditionalDeleteWithOnlySuggestionPass(e.ctx, t, e.store)
	})
	s.run(t, "ListPaging", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestListPaging(e.ctx, t, e.store)
	})
	s.run(t, "GetListNonRecursive", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestGetListNonRecursive(e.ctx, t, e.increaseRV(), e.store)
	})
	s.run(t, "GetListRecursivePrefix", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestGetListRecursivePrefix(e.ctx, t, e.store)
	})
	s.run(t, "KeySchema", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestKeySchema(e.ctx, t, e.store)
	})
	// The two error-aggregation tests assert on error messages that spell out
	// the full etcd key, so they need the store at the root: own server.
	s.run(t, "GetListWithErrorAggregation", fresh, func(t *testing.T, srv *serverProcess) {
		setGate(t, features.AllowUnsafeMalformedObjectDeletion, true)
		e := testSetup(t, srv, withoutKeyPrefix())
		st := etcd3.NewStoreWithUnsafeCorruptObjectDeletion(e.store, schema.GroupResource{Resource: "pods"})
		storagetesting.RunTestGetListWithErrorAggregation(e.ctx, t, e.withTransformerOverride(st), corruptObjectError())
	})
	s.run(t, "GetListWithoutErrorAggregation", fresh, func(t *testing.T, srv *serverProcess) {
		setGate(t, features.AllowUnsafeMalformedObjectDeletion, false)
		e := testSetup(t, srv, withoutKeyPrefix())
		storagetesting.RunTestGetListWithoutErrorAggregation(e.ctx, t, e.withTransformerOverride(e.store), corruptObjectError())
	})
	s.run(t, "GuaranteedUpdate", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestGuaranteedUpdate(e.ctx, t, e.withPrefixTransformer(), e.checkStorageInvariants())
	})
	s.run(t, "GuaranteedUpdateWithTTL", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestGuaranteedUpdateWithTTL(e.ctx, t, e.store)
	})
	s.run(t, "GuaranteedUpdateChecksStoredData", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestGuaranteedUpdateChecksStoredData(e.ctx, t, e.withPrefixTransformer())
	})
	s.run(t, "GuaranteedUpdateWithConflict", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestGuaranteedUpdateWithConflict(e.ctx, t, e.store)
	})
	s.run(t, "GuaranteedUpdateWithSuggestionAndConflict", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestGuaranteedUpdateWithSuggestionAndConflict(e.ctx, t, e.store)
	})
	s.run(t, "TransformationFailure", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestTransformationFailure(e.ctx, t, e.withPrefixTransformer())
	})
	t.Run("List", func(t *testing.T) {
		for _, rangeStream := range []bool{false, true} {
			s.run(t, fmt.Sprintf("rangeStream=%v", rangeStream), fresh, func(t *testing.T, srv *serverProcess) {
				setGate(t, features.EtcdRangeStream, rangeStream)
				resetFeatureSupportChecker(t)
				e := testSetup(t, srv)
				storagetesting.RunTestList(e.ctx, t, e.store, e.compaction(), false, e.lists)
				streamReads := e.kv.GetStreamReadsAndReset()
				if rangeStream && streamReads == 0 {
					t.Error("expected lists to be served by RangeStream")
				}
				if !rangeStream && streamReads > 0 {
					t.Errorf("expected no RangeStream requests with the feature disabled, got %d", streamReads)
				}
			})
		}
	})
	t.Run("ConsistentList", func(t *testing.T) {
		for _, rangeStream := range []bool{false, true} {
			s.run(t, fmt.Sprintf("rangeStream=%v", rangeStream), shared, func(t *testing.T, srv *serverProcess) {
				setGate(t, features.EtcdRangeStream, rangeStream)
				resetFeatureSupportChecker(t)
				e := testSetup(t, srv)
				storagetesting.RunTestConsistentList(e.ctx, t, e.store, e.increaseRV(), false, true, false)
			})
		}
	})
	s.run(t, "CompactRevision", fresh, func(t *testing.T, srv *serverProcess) {
		// The store must observe external compactions: its compactor watches compact_rev_key with this gate.
		setGate(t, features.ListFromCacheSnapshot, true)
		e := testSetup(t, srv)
		storagetesting.RunTestCompactRevision(e.ctx, t, e.store, e.increaseRV(), e.compaction())
	})
	s.run(t, "ListContinuation", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestListContinuation(e.ctx, t, e.store, e.checkStorageCallsInvariants())
	})
	s.run(t, "ListPaginationRareObject", shared, func(t *testing.T, srv *serverProcess) {
		// ListFromCacheSnapshot adds a Get of compact_rev_key that the call counting does not expect.
		setGate(t, features.ListFromCacheSnapshot, false)
		e := testSetup(t, srv)
		storagetesting.RunTestListPaginationRareObject(e.ctx, t, e.store, e.checkStorageCallsInvariants())
	})
	s.run(t, "ListContinuationWithFilter", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestListContinuationWithFilter(e.ctx, t, e.store, e.checkStorageCallsInvariants())
	})
	s.run(t, "NamespaceScopedList", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestNamespaceScopedList(e.ctx, t, e.store)
	})
	s.run(t, "ListInconsistentContinuation", fresh, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestListInconsistentContinuation(e.ctx, t, e.store, e.compaction())
	})
	s.run(t, "ListResourceVersionMatch", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestListResourceVersionMatch(e.ctx, t, e.withPrefixTransformer())
	})
	t.Run("Stats", func(t *testing.T) {
		for _, sizeBased := range []bool{true, false} {
			s.run(t, fmt.Sprintf("SizeBasedListCostEstimate=%v", sizeBased), shared, func(t *testing.T, srv *serverProcess) {
				e := testSetup(t, srv)
				if sizeBased {
					if err := e.store.EnableResourceSizeEstimation(e.getKeys); err != nil {
						t.Fatal(err)
					}
				}
				storagetesting.RunTestStats(e.ctx, t, e.store, e.codec, e.transformer, sizeBased)
			})
		}
	})

	// ---- watcher_test.go ----
	s.run(t, "Watch", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestWatch(e.ctx, t, e.store)
	})
	s.run(t, "ClusterScopedWatch", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestClusterScopedWatch(e.ctx, t, e.store)
	})
	s.run(t, "NamespaceScopedWatch", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestNamespaceScopedWatch(e.ctx, t, e.store)
	})
	s.run(t, "DeleteTriggerWatch", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestDeleteTriggerWatch(e.ctx, t, e.store)
	})
	s.run(t, "WatchFromZero", fresh, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestWatchFromZero(e.ctx, t, e.store, e.compaction())
	})
	s.run(t, "WatchFromNonZero", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestWatchFromNonZero(e.ctx, t, e.store)
	})
	s.run(t, "DelayedWatchDelivery", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestDelayedWatchDelivery(e.ctx, t, e.store)
	})
	s.run(t, "WatchError", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestWatchError(e.ctx, t, e.withPrefixTransformer())
	})
	s.run(t, "WatchContextCancel", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestWatchContextCancel(e.ctx, t, e.store)
	})
	s.run(t, "WatcherTimeout", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestWatcherTimeout(e.ctx, t, e.store)
	})
	s.run(t, "WatchDeleteEventObjectHaveLatestRV", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestWatchDeleteEventObjectHaveLatestRV(e.ctx, t, e.store)
	})
	s.run(t, "WatchInitializationSignal", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestWatchInitializationSignal(e.ctx, t, e.store)
	})
	s.run(t, "ProgressNotify", progress, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunOptionalTestProgressNotify(e.ctx, t, e.store, e.increaseRV())
	})
	s.run(t, "WatchWithUnsafeDelete", shared, func(t *testing.T, srv *serverProcess) {
		setGate(t, features.AllowUnsafeMalformedObjectDeletion, true)
		e := testSetup(t, srv)
		storagetesting.RunTestWatchWithUnsafeDelete(e.ctx, t, e.withTransformerOverride(e.store), corruptObjectError())
	})
	s.run(t, "WatchDispatchBookmarkEvents", progress, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunTestWatchDispatchBookmarkEvents(e.ctx, t, e.store, false)
	})
	s.run(t, "SendInitialEventsBackwardCompatibility", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunSendInitialEventsBackwardCompatibility(e.ctx, t, e.store)
	})
	for _, rangeStream := range []bool{false, true} {
		t.Run(fmt.Sprintf("RangeStream=%v", rangeStream), func(t *testing.T) {
			setGate(t, features.EtcdRangeStream, rangeStream)
			resetFeatureSupportChecker(t)
			s.run(t, "WatchSemantics", shared, func(t *testing.T, srv *serverProcess) {
				e := testSetup(t, srv)
				storagetesting.RunWatchSemantics(e.ctx, t, e.store)
			})
			s.run(t, "WatchSemanticsWithConcurrentDecode", shared, func(t *testing.T, srv *serverProcess) {
				setGate(t, features.ConcurrentWatchObjectDecode, true)
				e := testSetup(t, srv)
				storagetesting.RunWatchSemantics(e.ctx, t, e.store)
			})
			s.run(t, "WatchSemanticInitialEventsExtended", shared, func(t *testing.T, srv *serverProcess) {
				e := testSetup(t, srv)
				storagetesting.RunWatchSemanticInitialEventsExtended(e.ctx, t, e.store)
			})
			s.run(t, "WatchListMatchSingle", shared, func(t *testing.T, srv *serverProcess) {
				e := testSetup(t, srv)
				storagetesting.RunWatchListMatchSingle(e.ctx, t, e.store)
			})
		})
	}
	s.run(t, "WatchErrorEventIsBlockingFurtherEvent", shared, func(t *testing.T, srv *serverProcess) {
		e := testSetup(t, srv)
		storagetesting.RunWatchErrorIsBlockingFurtherEvents(e.ctx, t, e.withPrefixTransformer())
	})
}
