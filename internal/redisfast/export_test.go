package redisfast

// Refresh refreshes every lock s holds, now.
func Refresh(s *Store) {
	s.locks.mu.Lock()
	names := make([]string, 0, len(s.locks.held))
	for n := range s.locks.held {
		names = append(names, n)
	}
	s.locks.mu.Unlock()
	s.locks.refresh(names)
}
