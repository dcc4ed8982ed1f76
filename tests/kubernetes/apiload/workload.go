package main

import (
	"context"
	"fmt"
	"log"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

const (
	// namespace holds the pre-created ConfigMaps and the Leases.
	namespace = "load"
	// createdNamespace holds the ConfigMaps created during the load, so that
	// the lists in namespace always cover the same --objects ConfigMaps.
	createdNamespace = "load-created"
)

// The verbs, in report order, with their default rates.
var (
	verbNames    = []string{"create", "update", "get", "list", "lease"}
	defaultRates = map[string]float64{"create": 50, "update": 100, "get": 100, "list": 5, "lease": 100}
	verbHelp     = map[string]string{
		"create": "ConfigMap creates (new names, in namespace " + createdNamespace + ")",
		"update": "updates of a random pre-created ConfigMap",
		"get":    "gets of a random pre-created ConfigMap",
		"list":   "paged lists of every ConfigMap in namespace " + namespace,
		"lease":  "Lease renewals (Update of spec.renewTime)",
	}
	writeVerbs = map[string]bool{"create": true, "update": true, "lease": true}
)

// slot is one pre-created object: the last copy the server returned, and a
// lock so that one request at a time writes it.
type slot[T any] struct {
	mu  sync.Mutex
	obj T
}

// pool is the set of pre-created objects of one kind.
type pool[T any] []*slot[T]

// acquire locks and returns the first idle slot at or after i, wrapping
// around; when every slot is busy it waits for slot i.
func (p pool[T]) acquire(i int) *slot[T] {
	n := len(p)
	for k := 0; k < n; k++ {
		if s := p[(i+k)%n]; s.mu.TryLock() {
			return s
		}
	}
	s := p[i%n]
	s.mu.Lock()
	return s
}

// workload holds the objects the load works on and sends its requests.
type workload struct {
	client   kubernetes.Interface
	payload  string // the ~1 KiB data value of every ConfigMap
	runID    string // makes created names unique across runs on one store
	pageSize int64
	names    []string // the pre-created ConfigMaps, for gets
	cms      pool[*corev1.ConfigMap]
	leases   pool[*coordinationv1.Lease]

	created   atomic.Int64 // creates sent so far
	revisions atomic.Int64 // updates sent so far, written into each update
	leaseTurn atomic.Int64 // renewals sent so far; picks the next Lease in turn
}

// sample is what one request did: when it was sent and answered (the
// latency), how many pages a list read, and its error.
type sample struct {
	sent, answered time.Time
	pages          int
	err            error
}

// timed runs one request and returns its sample.
func timed(request func() error) sample {
	s := sample{sent: time.Now()}
	s.err = request()
	s.answered = time.Now()
	return s
}

// prepare creates the namespaces, the ConfigMaps and the Leases (taking over
// any left by an earlier run on the same store).
func prepare(ctx context.Context, client kubernetes.Interface, o *options) (*workload, error) {
	w := &workload{
		client:   client,
		payload:  strings.Repeat("x", o.valueSize),
		runID:    fmt.Sprintf("%06x", rand.Uint32()&0xffffff),
		pageSize: o.pageSize,
		names:    make([]string, o.objects),
		cms:      make(pool[*corev1.ConfigMap], o.objects),
		leases:   make(pool[*coordinationv1.Lease], o.leases),
	}
	start := time.Now()
	for _, ns := range []string{namespace, createdNamespace} {
		_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	cms := client.CoreV1().ConfigMaps(namespace)
	err := parallel(o.objects, 16, func(i int) error {
		name := fmt.Sprintf("cm-%05d", i)
		cm, err := cms.Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Data:       map[string]string{"payload": w.payload, "rev": "0"},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			cm, err = cms.Get(ctx, name, metav1.GetOptions{})
		}
		if err != nil {
			return fmt.Errorf("ConfigMap %s: %w", name, err)
		}
		w.names[i] = name
		w.cms[i] = &slot[*corev1.ConfigMap]{obj: cm}
		return nil
	})
	if err != nil {
		return nil, err
	}
	leases := client.CoordinationV1().Leases(namespace)
	err = parallel(o.leases, 16, func(i int) error {
		name := fmt.Sprintf("node-%05d", i)
		now := metav1.NowMicro()
		holder, duration := name, int32(40)
		l, err := leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       &holder,
				LeaseDurationSeconds: &duration,
				AcquireTime:          &now,
				RenewTime:            &now,
			},
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			l, err = leases.Get(ctx, name, metav1.GetOptions{})
		}
		if err != nil {
			return fmt.Errorf("Lease %s: %w", name, err)
		}
		w.leases[i] = &slot[*coordinationv1.Lease]{obj: l}
		return nil
	})
	if err != nil {
		return nil, err
	}
	log.Printf("prepared %d ConfigMaps and %d Leases in namespace %s in %v",
		o.objects, o.leases, namespace, time.Since(start).Round(time.Millisecond))
	return w, nil
}

// parallel calls fn(i) for every i in [0, n) on up to workers goroutines and
// returns the first error; after an error no new calls start.
func parallel(n, workers int, fn func(i int) error) error {
	var (
		next     atomic.Int64
		failed   atomic.Bool
		firstErr error
		once     sync.Once
		wg       sync.WaitGroup
	)
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { firstErr = err })
					failed.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// op returns the request function of a verb.
func (w *workload) op(verb string) func(context.Context) sample {
	switch verb {
	case "create":
		return w.create
	case "update":
		return w.update
	case "get":
		return w.get
	case "list":
		return w.list
	case "lease":
		return w.renew
	}
	panic("unknown verb " + verb)
}

// create creates a ConfigMap with a new name.
func (w *workload) create(ctx context.Context) sample {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c-%s-%07d", w.runID, w.created.Add(1))},
		Data:       map[string]string{"payload": w.payload},
	}
	return timed(func() error {
		_, err := w.client.CoreV1().ConfigMaps(createdNamespace).Create(ctx, cm, metav1.CreateOptions{})
		return err
	})
}

// update writes a new revision of a random pre-created ConfigMap from the
// copy the last write returned, as a controller does. After a 409 Conflict it
// refetches the object (untimed) for the next update.
func (w *workload) update(ctx context.Context) sample {
	s := w.cms.acquire(rand.IntN(len(w.cms)))
	defer s.mu.Unlock()
	cm := s.obj.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data["rev"] = strconv.FormatInt(w.revisions.Add(1), 10)
	return updateSlot(ctx, w.client.CoreV1().ConfigMaps(namespace), s, cm.Name, cm)
}

// typedClient is the part of a typed client updateSlot needs.
type typedClient[T any] interface {
	Update(context.Context, T, metav1.UpdateOptions) (T, error)
	Get(context.Context, string, metav1.GetOptions) (T, error)
}

// updateSlot sends next, an edited copy of the slot's object, as an Update
// (the timed sample) and keeps what comes back; after a 409 Conflict it
// refetches the object (untimed) for the next update.
func updateSlot[T any](ctx context.Context, c typedClient[T], s *slot[T], name string, next T) sample {
	var got T
	res := timed(func() (err error) {
		got, err = c.Update(ctx, next, metav1.UpdateOptions{})
		return err
	})
	switch {
	case res.err == nil:
		s.obj = got
	case apierrors.IsConflict(res.err):
		if fresh, err := c.Get(ctx, name, metav1.GetOptions{}); err == nil {
			s.obj = fresh
		}
	}
	return res
}

// get reads a random pre-created ConfigMap (a quorum read: no resourceVersion).
func (w *workload) get(ctx context.Context) sample {
	name := w.names[rand.IntN(len(w.names))]
	return timed(func() error {
		_, err := w.client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
		return err
	})
}

// list reads every ConfigMap in namespace in pages of pageSize, following
// Continue to the end; the sample covers all the pages.
func (w *workload) list(ctx context.Context) sample {
	cms := w.client.CoreV1().ConfigMaps(namespace)
	pages := 0
	s := timed(func() error {
		opts := metav1.ListOptions{Limit: w.pageSize}
		for {
			l, err := cms.List(ctx, opts)
			if err != nil {
				return fmt.Errorf("page %d: %w", pages+1, err)
			}
			pages++
			if l.Continue == "" {
				return nil
			}
			opts.Continue = l.Continue
		}
	})
	s.pages = pages
	return s
}

// renew renews the next Lease in turn, as a kubelet does: an Update of
// spec.renewTime from the copy the last renewal returned.
func (w *workload) renew(ctx context.Context) sample {
	s := w.leases.acquire(int((w.leaseTurn.Add(1) - 1) % int64(len(w.leases))))
	defer s.mu.Unlock()
	l := s.obj.DeepCopy()
	now := metav1.NowMicro()
	l.Spec.RenewTime = &now
	return updateSlot(ctx, w.client.CoordinationV1().Leases(namespace), s, l.Name, l)
}
