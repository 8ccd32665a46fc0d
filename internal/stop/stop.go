// Package stop tells whether a stop was asked for: a channel closed to
// tell every goroutine that watches it to start nothing new (a config
// stopping, a job handed over, a window that halted).
package stop

// Asked reports whether c is closed, without waiting for it; a nil c
// never is.
func Asked(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
