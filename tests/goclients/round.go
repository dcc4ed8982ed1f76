// Command round runs one put/get/watch/lease round against an etcd-compatible cluster with
// the etcd Go client this module is built against (go.mod: v3.6; v3.5.0.mod and v3.5.9.mod
// through -modfile), and exits non-zero, saying why, at the first answer that differs from
// what etcd gives. server/tests/goclients.rs builds it for each version and runs it against
// cairn.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

func main() {
	endpoints := flag.String("endpoints", "", "comma-separated client URLs")
	authority := flag.String("authority", "", "send this :authority instead of the client's own")
	prefix := flag.String("prefix", "round/", "keys are written under this prefix")
	cacert := flag.String("cacert", "", "for https endpoints: the CA that signed the server's certificate")
	cert := flag.String("cert", "", "for https endpoints: the client's certificate, for client certificate authentication")
	key := flag.String("key", "", "the client certificate's key")
	flag.Parse()
	tlsConfig, err := clientTLS(*cacert, *cert, *key)
	if err != nil {
		fmt.Fprintln(os.Stderr, "round failed:", err)
		os.Exit(1)
	}
	if err := run(strings.Split(*endpoints, ","), *authority, *prefix, tlsConfig); err != nil {
		fmt.Fprintln(os.Stderr, "round failed:", err)
		os.Exit(1)
	}
	fmt.Println("round passed")
}

// clientTLS is the TLS configuration the flags ask for, nil for none.
func clientTLS(cacert, cert, key string) (*tls.Config, error) {
	if cacert == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(cacert)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no certificate", cacert)
	}
	config := &tls.Config{RootCAs: roots}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, err
		}
		config.Certificates = []tls.Certificate{pair}
	}
	return config, nil
}

func run(endpoints []string, authority, prefix string, tlsConfig *tls.Config) error {
	cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: 10 * time.Second, TLS: tlsConfig}
	if authority != "" {
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithAuthority(authority))
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return fmt.Errorf("connecting: %w", err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Put and get, with revisions.
	put, err := c.Put(ctx, prefix+"a", "1")
	if err != nil {
		return fmt.Errorf("put: %w", err)
	}
	got, err := c.Get(ctx, prefix+"a")
	if err != nil {
		return fmt.Errorf("get: %w", err)
	}
	if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "1" || got.Kvs[0].ModRevision != put.Header.Revision {
		return fmt.Errorf("get after put at %d: %v", put.Header.Revision, got.Kvs)
	}

	// A watch from the put's revision sees it, then a new put, in order.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	events := c.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(put.Header.Revision), clientv3.WithPrevKV())
	second, err := c.Put(ctx, prefix+"a", "2")
	if err != nil {
		return fmt.Errorf("second put: %w", err)
	}
	var seen []string
	for len(seen) < 2 {
		w, ok := <-events
		if !ok {
			return fmt.Errorf("watch closed after %v", seen)
		}
		if err := w.Err(); err != nil {
			return fmt.Errorf("watch: %w", err)
		}
		for _, e := range w.Events {
			seen = append(seen, fmt.Sprintf("%s %s=%s@%d", e.Type, e.Kv.Key, e.Kv.Value, e.Kv.ModRevision))
		}
	}
	want := []string{
		fmt.Sprintf("PUT %sa=1@%d", prefix, put.Header.Revision),
		fmt.Sprintf("PUT %sa=2@%d", prefix, second.Header.Revision),
	}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		return fmt.Errorf("watch saw %v, want %v", seen, want)
	}
	wcancel()

	// A lease: granted, a key attached, kept alive once, its TTL read, revoked with its key.
	lease, err := c.Grant(ctx, 30)
	if err != nil {
		return fmt.Errorf("lease grant: %w", err)
	}
	if _, err := c.Put(ctx, prefix+"leased", "x", clientv3.WithLease(lease.ID)); err != nil {
		return fmt.Errorf("put with lease: %w", err)
	}
	alive, err := c.KeepAliveOnce(ctx, lease.ID)
	if err != nil || alive.TTL != 30 {
		return fmt.Errorf("keep-alive: %v, %v", alive, err)
	}
	ttl, err := c.TimeToLive(ctx, lease.ID, clientv3.WithAttachedKeys())
	if err != nil || len(ttl.Keys) != 1 || string(ttl.Keys[0]) != prefix+"leased" || ttl.TTL <= 0 || ttl.TTL > 30 {
		return fmt.Errorf("time to live: %v, %v", ttl, err)
	}
	if _, err := c.Revoke(ctx, lease.ID); err != nil {
		return fmt.Errorf("revoke: %w", err)
	}
	gone, err := c.Get(ctx, prefix+"leased")
	if err != nil || len(gone.Kvs) != 0 {
		return fmt.Errorf("the leased key after revoke: %v, %v", gone, err)
	}

	// Every endpoint answers Status with a strict semver version of at least 3.5.13.
	for _, ep := range endpoints {
		s, err := c.Status(ctx, ep)
		if err != nil {
			return fmt.Errorf("status of %s: %w", ep, err)
		}
		if s.Version != "3.6.0" {
			return fmt.Errorf("status of %s: version %q", ep, s.Version)
		}
	}
	return nil
}
