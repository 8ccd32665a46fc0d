package batchapp

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"testing"

	"github.com/caddyserver/certmagic"
)

// TestFileListingWhileKeysAreWritten: a folder listed while keys in it
// are written (each through a temporary file renamed into its key) is
// listed, not taken for missing; a missing folder still is.
func TestFileListingWhileKeysAreWritten(t *testing.T) {
	ctx := context.Background()
	s := DurableStorage(&certmagic.FileStorage{Path: t.TempDir()})
	if err := s.Store(ctx, "jobs/a/job", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := s.Store(ctx, fmt.Sprintf("jobs/a/lease.%d", i%4), []byte("{}")); err != nil {
				t.Error(err)
				return
			}
		}
	})
	for range 2000 {
		if _, err := s.List(ctx, "jobs/a", false); err != nil {
			t.Errorf("listing a folder being written: %v", err)
			break
		}
	}
	close(stop)
	wg.Wait()
	if _, err := s.List(ctx, "jobs/b", false); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("listing a missing folder: %v, want fs.ErrNotExist", err)
	}
}
