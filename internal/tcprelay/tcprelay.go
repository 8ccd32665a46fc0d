// Package tcprelay is a TCP relay that a test puts between a client and
// its server (a Caddy instance and Redis, say) to give that one client
// the faults a real network gives: a cut, a partition that later heals,
// a server that came back at another address. The test drives it from
// its own goroutine while the relay forwards on others.
package tcprelay

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Relay listens on a loopback port and forwards each connection it
// accepts to its target. The zero value is not usable: call New.
type Relay struct {
	ln net.Listener

	// mu guards everything below; it is never held while a connection
	// reads, writes or dials, so that a slow peer cannot stall the test.
	mu     sync.Mutex
	target string
	cut    bool
	// gate is closed while bytes flow; Hold puts an open one in its
	// place, and Release closes it.
	gate   chan struct{}
	conns  map[*pair]struct{}
	closed bool
	// delay is added to every byte on its way to the target (SetDelay).
	delay time.Duration
	// observe sees every read from a client (Observe).
	observe func([]byte)

	wg sync.WaitGroup // the accept loop and every pair's pumps
}

// pair is one relayed connection: the client's side, and the target's
// once dialled.
type pair struct {
	client net.Conn
	dialed chan struct{} // closed once the dial was tried (or p ended first)
	done   chan struct{} // closed by end

	mu       sync.Mutex // guards upstream and ended
	upstream net.Conn
	ended    bool
}

// New listens on a free loopback port and relays to target (host:port).
func New(target string) (*Relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	open := make(chan struct{})
	close(open)
	r := &Relay{ln: ln, target: target, gate: open, conns: map[*pair]struct{}{}}
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

// Addr is the relay's address (host:port): what the client is given
// instead of the target's.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// Cut closes every relayed connection at once, resetting the client's
// side, and resets each connection accepted until Restore: what a client
// sees when the network between it and the server fails outright. Calls
// fail at once instead of hanging, which is the other shape of a fault
// (Hold is the first).
func (r *Relay) Cut() {
	r.mu.Lock()
	r.cut = true
	conns := r.takeConns()
	r.mu.Unlock()
	for _, p := range conns {
		p.end(true)
	}
}

// Restore accepts and relays connections again after Cut. Connections
// Cut closed stay closed: the client reconnects, as after a real outage.
func (r *Relay) Restore() {
	r.mu.Lock()
	r.cut = false
	r.mu.Unlock()
}

// Hold stops forwarding in both directions, on the connections relayed
// now and on those accepted meanwhile, without closing any: the bytes
// (and a side's close) wait, and go through in order on Release. It is
// how a partition that later heals looks to a client: its calls hang,
// then complete, late. A connection accepted while held is dialled only
// on Release, so that the target may be restarted, or Retarget given,
// while the client waits. Bytes a pump was already writing when Hold was
// called may still arrive, as on a real network.
func (r *Relay) Hold() {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.gate:
		r.gate = make(chan struct{})
	default: // held already
	}
}

// Release forwards again what Hold kept waiting, in order, and from then
// on as it comes.
func (r *Relay) Release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.gate:
	default:
		close(r.gate)
	}
}

// Retarget points the connections accepted from now on (and those held
// and not yet dialled) at addr: a server restarted on another port, or
// another server. Connections already dialled stay with the old target.
func (r *Relay) Retarget(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.target = addr
}

// Close stops listening, closes every relayed connection and returns
// once every goroutine of the relay has ended, so that a test leaves
// nothing running behind it.
func (r *Relay) Close() error {
	r.mu.Lock()
	r.closed = true
	conns := r.takeConns()
	r.mu.Unlock()
	err := r.ln.Close()
	for _, p := range conns {
		p.end(false)
	}
	r.wg.Wait()
	return err
}

// takeConns empties the relay's set of connections and returns what it
// held. r.mu is held.
func (r *Relay) takeConns() []*pair {
	var out []*pair
	for p := range r.conns {
		out = append(out, p)
	}
	clear(r.conns)
	return out
}

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(5 * time.Millisecond) // a transient error (too many files)
			continue
		}
		r.mu.Lock()
		if r.closed || r.cut {
			r.mu.Unlock()
			reset(c)
			continue
		}
		p := &pair{client: c, dialed: make(chan struct{}), done: make(chan struct{})}
		r.conns[p] = struct{}{}
		r.wg.Add(2)
		r.mu.Unlock()
		go r.pump(p, true)
		go r.pump(p, false)
	}
}

// pump forwards one direction of p: the client's bytes to the target
// (toUpstream), or the target's to the client. Each read is forwarded
// only while the gate is open; a read's end (EOF, or an error) is
// forwarded as the end of the whole pair, in both directions, since the
// protocols relayed (Redis) never half-close.
func (r *Relay) pump(p *pair, toUpstream bool) {
	defer r.wg.Done()
	defer r.forget(p)
	var src, dst net.Conn
	if toUpstream {
		// The target is dialled once bytes may flow: a connection
		// accepted while held reaches the target of Release's time.
		if !r.wait(p) || !p.dial(r) {
			return
		}
		src, dst = p.client, p.upstream
	} else {
		select {
		case <-p.dialed:
		case <-p.done:
			return
		}
		src, dst = p.upstream, p.client
		if src == nil {
			return
		}
	}
	write := dst.Write
	if toUpstream {
		queue := r.delayed(p, dst)
		defer close(queue)
		write = func(b []byte) (int, error) {
			r.mu.Lock()
			at, observe := time.Now().Add(r.delay), r.observe
			r.mu.Unlock()
			if observe != nil {
				observe(b)
			}
			select {
			case queue <- chunk{at, append([]byte(nil), b...)}:
				return len(b), nil
			case <-p.done:
				return 0, net.ErrClosed
			}
		}
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if !r.wait(p) {
			return
		}
		if n > 0 {
			if _, werr := write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// chunk is bytes read from the client, and when they may reach the
// target.
type chunk struct {
	at time.Time
	b  []byte
}

// SetDelay makes every byte the clients send reach the target d after
// it was read (0: at once), as a server d further away would see it: a
// request and its answer take d more, however many are in flight, and
// their order is kept.
func (r *Relay) SetDelay(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.delay = d
}

// Observe makes f see every read from a client on its way to the
// target, before it is sent on: a request, for a client that waits for
// each answer before it sends the next (as a Redis client does on one
// connection). f runs on the relay's goroutines, one per connection.
func (r *Relay) Observe(f func(b []byte)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.observe = f
}

// delayed writes the chunks sent on the channel it returns to dst, each
// at its time, in order, until the channel is closed or p ends.
func (r *Relay) delayed(p *pair, dst net.Conn) chan<- chunk {
	queue := make(chan chunk, 1024)
	r.wg.Go(func() {
		for {
			select {
			case c, ok := <-queue:
				if !ok {
					return
				}
				if wait := time.Until(c.at); wait > 0 {
					time.Sleep(wait)
				}
				if _, err := dst.Write(c.b); err != nil {
					p.end(false)
					return
				}
			case <-p.done:
				return
			}
		}
	})
	return queue
}

// wait returns once the gate is open (true), or once p ended (false).
func (r *Relay) wait(p *pair) bool {
	r.mu.Lock()
	gate := r.gate
	r.mu.Unlock()
	select {
	case <-gate:
	case <-p.done:
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// forget ends p and drops it from the relay's set.
func (r *Relay) forget(p *pair) {
	p.end(false)
	r.mu.Lock()
	delete(r.conns, p)
	r.mu.Unlock()
}

// dial connects p to the relay's target of the moment, and reports
// whether it could; a target that cannot be reached ends p with a reset,
// as a server that is down refuses. Only p's client pump dials, once.
func (p *pair) dial(r *Relay) bool {
	defer close(p.dialed)
	r.mu.Lock()
	target := r.target
	r.mu.Unlock()
	c, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		p.end(true)
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended { // cut or closed while dialling
		c.Close()
		return false
	}
	p.upstream = c
	return true
}

// end closes both sides of p, once; with rst, the client's side is
// reset (RST, not FIN), as a cut connection is.
func (p *pair) end(rst bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return
	}
	p.ended = true
	close(p.done)
	if rst {
		reset(p.client)
	} else {
		p.client.Close()
	}
	if p.upstream != nil {
		p.upstream.Close()
	}
}

// reset closes c with an RST, so that the client sees its connection
// reset rather than ended cleanly.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

var _ io.Closer = (*Relay)(nil)
