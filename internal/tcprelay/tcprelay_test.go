package tcprelay

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// echoServer answers each line it reads with name, a colon and the line,
// so that a test can tell which target a connection reached. It stops
// when the test ends, closing what it accepted (the relay's side may
// still be open then).
func echoServer(t *testing.T, name string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { echo(c, name) })
		}
	})
	return ln.Addr().String()
}

func echo(c net.Conn, name string) {
	defer c.Close()
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		if _, err := io.WriteString(c, name+":"+sc.Text()+"\n"); err != nil {
			return
		}
	}
}

func newRelay(t *testing.T, target string) *Relay {
	t.Helper()
	r, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// client is one connection to the relay, reading line by line.
type client struct {
	net.Conn
	lines *bufio.Reader
}

func dial(t *testing.T, r *Relay) *client {
	t.Helper()
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{Conn: c, lines: bufio.NewReader(c)}
}

// ask sends line and returns the answer, or the error that came within
// wait instead.
func (c *client) ask(line string, wait time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(wait))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	got, err := c.lines.ReadString('\n')
	return strings.TrimSuffix(got, "\n"), err
}

// relayed is a relay to an echo server named "a", and a connection
// through it that was answered once.
func relayed(t *testing.T) (*Relay, *client) {
	t.Helper()
	r := newRelay(t, echoServer(t, "a"))
	c := dial(t, r)
	if got, err := c.ask("first", 5*time.Second); got != "a:first" || err != nil {
		t.Fatalf("through the relay: %q, %v", got, err)
	}
	return r, c
}

func TestForwards(t *testing.T) {
	r := newRelay(t, echoServer(t, "a"))
	c := dial(t, r)
	for _, line := range []string{"one", "two"} {
		if got, err := c.ask(line, 5*time.Second); got != "a:"+line || err != nil {
			t.Fatalf("ask %q: %q, %v", line, got, err)
		}
	}
}

// TestHold: while held, neither a relayed connection nor one accepted
// meanwhile gets an answer, and neither is closed; on Release both get
// theirs, late, as after a partition that healed.
func TestHold(t *testing.T) {
	r, old := relayed(t)
	r.Hold()
	if got, err := old.ask("held", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("a held connection answered %q, %v; want a timeout", got, err)
	}
	fresh := dial(t, r)
	if got, err := fresh.ask("new", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("a connection accepted while held answered %q, %v; want a timeout", got, err)
	}
	r.Release()
	for _, want := range []string{"a:held", "a:new"} {
		c := map[string]*client{"a:held": old, "a:new": fresh}[want]
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if got, err := c.lines.ReadString('\n'); got != want+"\n" || err != nil {
			t.Errorf("after Release: %q, %v; want %q", got, err, want)
		}
	}
	if got, err := old.ask("after", 5*time.Second); got != "a:after" || err != nil {
		t.Errorf("after Release: %q, %v", got, err)
	}
}

// TestCut: Cut resets the relayed connections and every one accepted
// until Restore; after it, new connections are relayed again.
func TestCut(t *testing.T) {
	r, c := relayed(t)
	r.Cut()
	if got, err := c.ask("cut", 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("a cut connection answered %q, %v; want it closed", got, err)
	}
	if err := refused(r); err != nil {
		t.Fatalf("a connection made while cut: %v", err)
	}
	r.Restore()
	if got, err := dial(t, r).ask("restored", 5*time.Second); got != "a:restored" || err != nil {
		t.Fatalf("after Restore: %q, %v", got, err)
	}
}

// TestRetarget: connections made after Retarget reach the new target,
// those made before stay with the old one; a connection held across a
// Retarget reaches the target of Release's time.
func TestRetarget(t *testing.T) {
	r, old := relayed(t)
	r.Hold()
	held := dial(t, r)
	_ = held.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(held, "held\n"); err != nil {
		t.Fatal(err)
	}
	r.Retarget(echoServer(t, "b"))
	r.Release()
	if got, err := held.lines.ReadString('\n'); got != "b:held\n" || err != nil {
		t.Errorf("a connection held across Retarget: %q, %v; want b's answer", got, err)
	}
	if got, err := dial(t, r).ask("y", 5*time.Second); got != "b:y" || err != nil {
		t.Errorf("a new connection: %q, %v; want b's answer", got, err)
	}
	if got, err := old.ask("z", 5*time.Second); got != "a:z" || err != nil {
		t.Errorf("an old connection: %q, %v; want a's answer", got, err)
	}
}

// TestTargetDown: a target that cannot be reached resets the client's
// connection, as a server that is down refuses it.
func TestTargetDown(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	down := ln.Addr().String()
	ln.Close()
	r := newRelay(t, down)
	if err := refused(r); err != nil {
		t.Fatal(err)
	}
}

// TestClose: Close ends held and relayed connections and stops
// listening, and returns only once its goroutines are gone.
func TestClose(t *testing.T) {
	r, c := relayed(t)
	r.Hold()
	held := dial(t, r)
	_, _ = io.WriteString(held, "held\n")
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	for _, cl := range []*client{c, held} {
		_ = cl.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := cl.lines.ReadString('\n'); err == nil || isTimeout(err) {
			t.Errorf("a connection outlived Close: %v", err)
		}
	}
	if c, err := net.DialTimeout("tcp", r.Addr(), time.Second); err == nil {
		c.Close()
		t.Error("the relay still listens after Close")
	}
}

// TestConcurrentControl drives the relay from several goroutines while
// clients talk through it: under -race, its state has no data race, and
// it ends whole.
func TestConcurrentControl(t *testing.T) {
	a, b := echoServer(t, "a"), echoServer(t, "b")
	r := newRelay(t, a)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 20 {
				if c, err := net.Dial("tcp", r.Addr()); err == nil {
					_ = c.SetDeadline(time.Now().Add(50 * time.Millisecond))
					_, _ = io.WriteString(c, "x\n")
					_, _ = bufio.NewReader(c).ReadString('\n')
					c.Close()
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 20 {
			r.Hold()
			r.Cut()
			r.Retarget([]string{a, b}[i%2])
			r.Release()
			r.Restore()
		}
	})
	wg.Wait()
}

// refused says what is wrong unless a new connection to r is closed
// without an answer: reset while connecting, or at its first request.
func refused(r *Relay) error {
	c, err := net.DialTimeout("tcp", r.Addr(), 5*time.Second)
	if err != nil {
		return nil
	}
	defer c.Close()
	cl := &client{Conn: c, lines: bufio.NewReader(c)}
	if got, err := cl.ask("x", 5*time.Second); err == nil || isTimeout(err) {
		return fmt.Errorf("answered %q, %v; want the connection closed", got, err)
	}
	return nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestDelay: with a delay set, each request reaches the target that much
// later, so that an exchange takes it more; Observe sees each request.
func TestDelay(t *testing.T) {
	r, c := relayed(t)
	r.SetDelay(30 * time.Millisecond)
	start := time.Now()
	if _, err := c.ask("ping", time.Second); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 30*time.Millisecond {
		t.Errorf("an exchange took %s, want at least the delay", took)
	}
	r.SetDelay(0)
	var seen []string
	var mu sync.Mutex
	r.Observe(func(b []byte) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, string(b))
	})
	if _, err := c.ask("ping", time.Second); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || !strings.HasPrefix(seen[0], "ping") {
		t.Errorf("observed %q, want the request", seen)
	}
}
