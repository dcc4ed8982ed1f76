// A TCP proxy in front of one member's peer port that can hold every byte back for a while,
// the slow link behind etcdMemberCommunicationSlow and etcdGRPCRequestsSlow.
//
// Each member advertises the proxy's address as its peer URL, so every connection another
// member opens to it, raft's streams and messages and the RTT probes alike, crosses this
// proxy once: with a delay d, a message between any two members arrives d late, and a round
// trip (a probe, an append and its acknowledgement) takes 2d more. Bytes keep their order:
// each direction is a queue of chunks, each written once its due time has come.
package main

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

type delayProxy struct {
	ln      net.Listener
	backend string
	delay   atomic.Int64 // nanoseconds each direction; read when a chunk arrives

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func newDelayProxy(listen, backend string) (*delayProxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	p := &delayProxy{ln: ln, backend: backend, conns: map[net.Conn]struct{}{}}
	go p.serve()
	return p, nil
}

func (p *delayProxy) setDelay(d time.Duration) { p.delay.Store(int64(d)) }

func (p *delayProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

func (p *delayProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *delayProxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

func (p *delayProxy) handle(client net.Conn) {
	backend, err := net.DialTimeout("tcp", p.backend, 2*time.Second)
	if err != nil {
		client.Close() // the member is down: refuse, as its own port would
		return
	}
	p.track(client, true)
	p.track(backend, true)
	defer p.track(client, false)
	defer p.track(backend, false)
	done := make(chan struct{})
	go func() { p.pipe(backend, client); close(done) }()
	p.pipe(client, backend)
	<-done
}

type chunk struct {
	data []byte
	due  time.Time
}

// pipe copies src to dst, each chunk delayed; when either side fails both are closed, which
// ends the other direction too (neither HTTP/1.1 nor HTTP/2 between members half-closes).
func (p *delayProxy) pipe(dst, src net.Conn) {
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				q <- chunk{buf[:n], time.Now().Add(time.Duration(p.delay.Load()))}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		if wait := time.Until(c.due); wait > 0 {
			time.Sleep(wait)
		}
		if _, err := dst.Write(c.data); err != nil {
			break
		}
	}
	src.Close()
	dst.Close()
	for range q { // let the reader finish
	}
}
