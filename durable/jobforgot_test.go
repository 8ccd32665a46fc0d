package durable

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/batch"
)

// A storage that forgot part of a job, or all of it (docs/durability.md,
// "A job at each fault"), over the cluster of jobfence_test.go.

// A lease key that vanishes (the storage forgot it, an operator deleted
// it) is a lost lease at the owner's next renewal: it sends nothing
// after, and writes nothing; a scan that then sees the job with no lease
// for a whole lease takes it over and carries it on.
func TestJobLeaseKeyVanishes(t *testing.T) {
	t.Parallel()
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		mem := newMemStorage()
		a, b := newJobInstance("A", mem), newJobInstance("B", mem)
		hj, token := startWidgets(t, a.js, jobFaultItems, true)
		id := hj.Record().ID
		up := newWidgetsUpstream(false)
		var vanished time.Time
		a.before = func(n int) {
			if n == 100 {
				if err := mem.Delete(context.Background(), jobLeases(id).key(0, Owner())); err != nil {
					t.Error(err)
				}
				vanished = now()
			}
		}
		err := hj.Run(context.Background(), a.through(t, up), nil)
		var lost *batch.LeaseLost
		if !errors.As(err, &lost) || !strings.Contains(lost.Why, "lease is gone") {
			t.Errorf("Run = %v, want the lease found gone", err)
		}
		// The next renewal comes within a third of a lease.
		renewed := vanished.Add(jobFaultLease / 3)
		if late := a.sentFrom(renewed); len(late) > 0 {
			t.Errorf("the owner sent %d creates after its lease was found gone, the first %+v", len(late), late[0])
		}
		if late := a.writesFrom(renewed); len(late) > 0 {
			t.Errorf("the owner wrote %d times after its lease was found gone, the first %+v", len(late), late[0])
		}
		ranToItsEnd(t, b.takeOver(t, b.through(t, up)))
		checkCarriedOn(t, b.js, id, token, up, a, b)
	})
}

// A job whose whole folder vanished (its record, input, lease, progress
// and results: a storage that forgot them): its owner finds its lease
// gone at its next renewal, learns that the record went with it, and
// stops, its error saying so; it writes nothing after, and never the
// progress, results or lease that would make a half job of what is
// left. The job is then no job: its status answers as for one that
// never was (ErrUnknownJob, 404).
func TestJobFolderVanishes(t *testing.T) {
	t.Parallel()
	// Mid-window, and as the first window ends, its results and the
	// progress about to be stored.
	for _, at := range []int{100, 256} {
		t.Run(fmt.Sprintf("at create %d", at), func(t *testing.T) {
			t.Parallel()
			folderVanishes(t, at)
		})
	}
}

func folderVanishes(t *testing.T, at int) {
	bubble(t, func(t *testing.T) {
		defer endHeld(t)
		mem := newMemStorage()
		a := newJobInstance("A", mem)
		hj, token := startWidgets(t, a.js, jobFaultItems, true)
		id := hj.Record().ID
		up := newWidgetsUpstream(false)
		var vanished time.Time
		a.before = func(n int) {
			if n == at {
				for _, key := range mem.keysUnder(jobDir(id)) {
					if err := mem.Delete(context.Background(), key); err != nil {
						t.Error(err)
					}
				}
				vanished = now()
			}
		}
		err := hj.Run(context.Background(), a.through(t, up), nil)
		var lost *batch.LeaseLost
		if !errors.As(err, &lost) || !strings.Contains(lost.Why, "record is gone") {
			t.Errorf("Run = %v, want the lease lost, the job's record gone", err)
		}
		renewed := vanished.Add(jobFaultLease / 3)
		if late := a.sentFrom(renewed); len(late) > 0 {
			t.Errorf("the owner sent %d creates after its lease was found gone, the first %+v", len(late), late[0])
		}
		for _, w := range a.writesFrom(vanished) {
			if !strings.Contains(w.key, "/"+logName+"/") || !w.at.Before(renewed) {
				t.Errorf("the owner wrote %s %s at %s, after the job's folder vanished at %s", w.op, w.key, w.at, vanished)
			}
		}
		for _, key := range mem.keysUnder(jobDir(id)) {
			if !strings.Contains(key, "/"+logName+"/") {
				t.Errorf("%s is back in the vanished job's folder", key)
			}
		}
		if _, err := a.js.Status(context.Background(), id, token); !errors.Is(err, ErrUnknownJob) {
			t.Errorf("the status of a job whose folder vanished: %v, want ErrUnknownJob (404)", err)
		}
		// Its entries go too: its client's at the client's next count,
		// so that the quota is free again; the active and index ones at
		// the first scan that found the job with no owner for a lease.
		if err := a.js.CheckQuota(context.Background(), goldenClient, Quota{PerClient: 1, Queued: 100}); err != nil {
			t.Errorf("a start of the client whose job vanished, max_jobs_per_client 1: %v, want room", err)
		}
		if left := mem.keysUnder(jobClientsPrefix); len(left) > 0 {
			t.Errorf("the client's entries %v stay", left)
		}
		r := &scanRoom{t: t, max: 1}
		scanOnce(t, a.js, r)
		if left := mem.keysUnder(jobActivePrefix); len(left) != 1 {
			t.Errorf("active entries %v after a scan that saw no owner yet, want the job's, until a lease passed", left)
		}
		time.Sleep(jobFaultLease + time.Second)
		scanOnce(t, a.js, r)
		if left := append(mem.keysUnder(jobActivePrefix), mem.keysUnder(jobIndexPrefix)...); len(left) > 0 || len(r.asked) > 0 {
			t.Errorf("entries %v after a scan a lease later, room asked for %v; want the entries gone, nothing run", left, r.asked)
		}
	})
}
