package stop

import "testing"

func TestAsked(t *testing.T) {
	c := make(chan struct{})
	if Asked(c) || Asked(nil) {
		t.Fatal("an open channel, or a nil one, asked for a stop")
	}
	close(c)
	if !Asked(c) {
		t.Fatal("a closed channel did not ask for a stop")
	}
}
