package durable

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddy-batch/caddy-batch/batch"
)

// Fencing (docs/durability.md, "A saga never writes after it lost its
// lease"): no two instances act on one saga at once, and an instance
// that may have lost a saga sends nothing for it until it knows.
//
// A saga's lease lives in its journal's folder, one key per epoch. The
// instance that began the saga holds epoch 0, under the name older
// builds read and renew ("lease"); each takeover writes the next epoch
// under a key of its own, named for its owner,
//
//	batch/v1/journal/<saga>/lease.<epoch>.<owner tag>
//
// and never writes over another instance's key. The highest epoch owns
// the saga. Renewal is conditional on a storage without compare-and-set:
// the holder reads its own key back (gone, or written by someone else:
// lost), writes it, and lists the folder for a key of a higher epoch,
// or of its own epoch by another owner (lost). A takeover writes its key
// first and then reads the old owner's again (changed: it steps back),
// so of a renewal and a takeover that race, at least one sees the
// other's write.

// leaseFolder is a folder holding a fenced lease among its other keys: a
// saga's journal folder, or a job's (docs/durability.md, "Bulk jobs in
// storage"); the same rules fence both. guard is the key a first renewal
// of epoch 0 must still find (the journal's intent, the job's record):
// gone, the storage lost what the lease is for. what names it in the
// reasons of a lost lease.
type leaseFolder struct {
	dir, guard, what string
}

// sagaLeases is the lease folder of a saga's journal.
func sagaLeases(saga string) leaseFolder {
	return leaseFolder{dir: journalDir(saga), guard: segmentKey(saga, 0), what: "saga"}
}

// key names the folder's lease key of epoch for owner.
func (f leaseFolder) key(epoch int, owner string) string {
	if epoch == 0 {
		return path.Join(f.dir, leaseName)
	}
	return path.Join(f.dir, fmt.Sprintf("%s.%08d.%s", leaseName, epoch, ownerTag(owner)))
}

// leaseKeyOf names the lease key of a saga's epoch for owner.
func leaseKeyOf(saga string, epoch int, owner string) string {
	return sagaLeases(saga).key(epoch, owner)
}

// ownerTag is owner as a key's name can hold it.
func ownerTag(owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return hex.EncodeToString(sum[:6])
}

// leaseEpoch is the epoch of the lease key named base, if it is one.
func leaseEpoch(base string) (int, bool) {
	if base == leaseName {
		return 0, true
	}
	rest, ok := strings.CutPrefix(base, leaseName+".")
	if !ok {
		return 0, false
	}
	digits, _, ok := strings.Cut(rest, ".")
	if !ok || len(digits) != 8 {
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	return n, err == nil && n > 0
}

// topLeases names the lease keys of the highest epoch among names (a
// journal folder's), and that epoch; none when there is no lease key.
func topLeases(names []string) (epoch int, keys []string) {
	epoch = -1
	for _, n := range names {
		e, ok := leaseEpoch(n)
		switch {
		case !ok || e < epoch:
		case e > epoch:
			epoch, keys = e, []string{n}
		default:
			keys = append(keys, n)
		}
	}
	return epoch, keys
}

// holder is what the instance running a saga knows of its lease: until
// when it stands, on each of its clocks, and whether it is lost.
type holder struct {
	length time.Duration
	// what names what the lease is for in the reason of its lapse: a
	// saga's when empty.
	what string

	mu sync.Mutex
	// mono and wall are when the lease lapses on the monotonic clock and
	// on the wall clock (a VM suspended stops the first, not the
	// second); the earlier decides.
	mono, wall time.Time
	// proven is when the last call that proved the lease began.
	proven time.Time
	lost   *batch.LeaseLost
	// changed is closed, and made anew, whenever the lease is proven or
	// lost, for a sender waiting on an unproven one.
	changed chan struct{}
}

func newHolder(length time.Duration) *holder {
	return &holder{length: length, changed: make(chan struct{})}
}

// prove records a lease proven by calls that began at start and
// returned now. Calls that took longer than a third of the lease prove
// nothing (a write that landed late must not extend a lease another
// instance may hold by now), and a lease that lapsed meanwhile stays
// lost. It reports whether the lease counts as proven.
func (h *holder) prove(start time.Time) bool {
	at := now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lapsedLocked(at) || at.Sub(start) > h.length/3 {
		return false
	}
	h.mono, h.wall, h.proven = start.Add(h.length), start.Round(0).Add(h.length), start
	h.signalLocked()
	return true
}

// lose makes the lease lost for good.
func (h *holder) lose(why string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lost == nil {
		h.lost = &batch.LeaseLost{Why: why, Proven: h.proven}
		h.signalLocked()
	}
}

func (h *holder) signalLocked() {
	close(h.changed)
	h.changed = make(chan struct{})
}

// lapsedLocked reports whether the lease lapsed by this process's own
// clocks at at, and if so makes it lost: a lease that lapsed is never
// proven again, whatever a later read finds. A lease never proven yet
// has not lapsed.
func (h *holder) lapsedLocked(at time.Time) bool {
	switch {
	case h.lost != nil:
		return true
	case h.mono.IsZero(), at.Before(h.mono) && at.Round(0).Before(h.wall):
		return false
	}
	h.lost = &batch.LeaseLost{Why: fmt.Sprintf("the %s's lease lapsed by this process's clock at %s: its renewals did not prove it in time (storage unreachable, or the process paused)", cmp.Or(h.what, "saga"), h.wall.Format(time.RFC3339)), Proven: h.proven}
	h.signalLocked()
	return true
}

// state is the lease at at: lost (its error), proven with a sixth of it
// to spare (no channel), or unproven (the channel that tells when that
// changes, and when it lapses, zero if it was never proven).
func (h *holder) state(at time.Time) (<-chan struct{}, time.Time, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.lapsedLocked(at):
		return nil, time.Time{}, h.lost
	case h.mono.IsZero():
		return h.changed, time.Time{}, nil
	}
	margin := h.length / 6
	if at.Before(h.mono.Add(-margin)) && at.Round(0).Before(h.wall.Add(-margin)) {
		return nil, time.Time{}, nil
	}
	return h.changed, h.mono, nil
}

// lostErr is the lease's loss, or nil while it is not lost.
func (h *holder) lostErr() *batch.LeaseLost {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lapsedLocked(now())
	return h.lost
}

// fence returns once the lease is proven with a sixth of it to spare:
// at once, or after a renewal proved it again. It returns the
// *batch.LeaseLost once the lease is lost, and an error wrapping
// batch.ErrLeaseUnproven when ctx ends first.
func (h *holder) fence(ctx context.Context) error {
	for {
		changed, lapse, err := h.state(now())
		if err != nil || changed == nil {
			return err
		}
		if err := waitChange(ctx, changed, lapse); err != nil {
			return err
		}
	}
}

// waitChange waits until changed is closed, lapse comes (when not
// zero), or ctx ends (an error wrapping batch.ErrLeaseUnproven).
func waitChange(ctx context.Context, changed <-chan struct{}, lapse time.Time) error {
	var timeout <-chan time.Time
	if !lapse.IsZero() {
		t := time.NewTimer(max(lapse.Sub(now()), time.Millisecond))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-changed:
	case <-timeout:
	case <-ctx.Done():
		return fmt.Errorf("%w (%w)", batch.ErrLeaseUnproven, context.Cause(ctx))
	}
	return nil
}

// lostLease is the error of a renewal that found the lease lost;
// takenOver when another instance's write shows (not only a key gone).
type lostLease struct {
	why       string
	takenOver bool
}

func (e *lostLease) Error() string { return e.why }

// renewLease renews the lease key of epoch for this process on a
// storage without compare-and-set: prev is what this process last
// stored there (nil when it never did: then segment 0, stored with the
// lease, must still be there). A *lostLease says the lease is lost; any
// other error leaves it unproven.
func (js *Journals) renewLease(ctx context.Context, saga string, epoch int, prev, maybe, next []byte) error {
	_, err := renewFolderLeaseOver(ctx, js.storage, sagaLeases(saga), epoch, prev, maybe, next)
	return err
}

// renewFolderLeaseOver is renewFolderLease over what this process last
// stored (prev), or what a renewal after it that answered an error may
// have stored (maybe): overOwn.
func renewFolderLeaseOver(ctx context.Context, s Storage, f leaseFolder, epoch int, prev, maybe, next []byte) (names []string, err error) {
	err = overOwn(prev, maybe, func(was []byte) (err error) {
		names, err = renewFolderLease(ctx, s, f, epoch, was, next)
		return err
	})
	return names, err
}

// overOwn runs write, a store guarded by what a key holds, over prev,
// what this process last stored there; and where the key holds another
// value and maybe is set, over maybe: what a later store of this
// process's wrote although it answered an error (a reply lost, a
// timeout after the write). A key holding that holds this process's
// own, not another instance's.
func overOwn(prev, maybe []byte, write func(was []byte) error) error {
	err := write(prev)
	if lost, ok := errors.AsType[*lostLease](err); ok && lost.takenOver && maybe != nil {
		return write(maybe)
	}
	return err
}

// renewFolderLease is renewLease in the lease folder f (the release of a
// lease too, whose next says it is released); it answers the names the
// folder listed, which show what else is there (a job's cancel mark) at
// no extra cost.
func renewFolderLease(ctx context.Context, s Storage, f leaseFolder, epoch int, prev, next []byte) ([]string, error) {
	key := f.key(epoch, Owner())
	if lr, ok := s.(LeaseRenewer); ok {
		if names, err := renewFolderAtOnce(ctx, lr, f, epoch, key, prev, next); !errors.Is(err, ErrUndecidable) {
			return names, err
		}
	}
	if prev != nil {
		b, err := s.Load(ctx, key)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil, f.leaseGone()
		case err != nil:
			return nil, err
		case !bytes.Equal(b, prev):
			return nil, &lostLease{fmt.Sprintf("another instance wrote the %s's lease", f.what), true}
		}
	} else if missing, err := gone(ctx, s, f.guard); missing {
		return nil, f.guardGone()
	} else if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		// The read came back after the renewal's time (a storage that
		// hung and healed, and does not heed ctx): the lease may have
		// lapsed meanwhile, and a record written now would only tell a
		// watching instance that the owner still renews.
		return nil, fmt.Errorf("renewing the %s's lease took longer than its time: %w", f.what, err)
	}
	if err := s.Store(ctx, key, next); err != nil {
		return nil, err
	}
	names, err := listNames(ctx, s, f.dir)
	if err != nil {
		return nil, err
	}
	return names, outranks(names, epoch, key)
}

func (f leaseFolder) leaseGone() *lostLease {
	return &lostLease{why: fmt.Sprintf("the %s's lease is gone from storage (the storage lost it, or an operator deleted it)", f.what)}
}

func (f leaseFolder) guardGone() *lostLease {
	record := map[string]string{"saga": "journal", "job": "record"}[f.what]
	return &lostLease{why: fmt.Sprintf("the %s's %s is gone from storage (the storage lost it, or an operator deleted it)", f.what, record)}
}

// LeaseRenewer is a storage that renews a lease in one call, at once
// (the Redis fast path): no other call comes between its check and its
// write.
type LeaseRenewer interface {
	// RenewLease stores next under key if key holds prev (ErrKeyGone,
	// ErrKeyChanged if not), or, with prev nil, if guard is there
	// (ErrKeyGone if not), and lists the names in key's folder.
	// ErrUndecidable: the storage cannot compare what key holds (another
	// instance compressed or encrypted it).
	RenewLease(ctx context.Context, key string, prev []byte, guard string, next []byte) (names []string, err error)
}

// The answers of a LeaseRenewer's check that failed.
var (
	ErrKeyGone     = errors.New("the key is not there")
	ErrKeyChanged  = errors.New("the key holds another value")
	ErrUndecidable = errors.New("the key's value is compressed or encrypted, and cannot be compared where it is stored")
)

// renewAtOnce is renewLease on a LeaseRenewer: the same checks, in one
// call.
func renewAtOnce(ctx context.Context, lr LeaseRenewer, saga string, epoch int, key string, prev, next []byte) error {
	_, err := renewFolderAtOnce(ctx, lr, sagaLeases(saga), epoch, key, prev, next)
	return err
}

// renewFolderAtOnce is renewAtOnce in the lease folder f, answering the
// names the folder listed.
func renewFolderAtOnce(ctx context.Context, lr LeaseRenewer, f leaseFolder, epoch int, key string, prev, next []byte) ([]string, error) {
	guard := ""
	if prev == nil {
		guard = f.guard
	}
	names, err := lr.RenewLease(ctx, key, prev, guard, next)
	switch {
	case errors.Is(err, ErrKeyGone) && prev != nil:
		return nil, f.leaseGone()
	case errors.Is(err, ErrKeyGone):
		return nil, f.guardGone()
	case errors.Is(err, ErrKeyChanged):
		return nil, &lostLease{fmt.Sprintf("another instance wrote the %s's lease", f.what), true}
	case err != nil:
		return nil, err
	}
	return names, outranks(names, epoch, key)
}

// outranks is outranked over a folder listed as names.
func outranks(names []string, epoch int, mine string) error {
	for _, n := range names {
		e, ok := leaseEpoch(n)
		if ok && (e > epoch || e == epoch && n != path.Base(mine)) {
			return &lostLease{fmt.Sprintf("another instance took it over (lease epoch %d)", e), true}
		}
	}
	return nil
}

// leaseRecord is the bytes of the nth lease this process stores for
// epoch, standing until until. n makes every renewal's bytes new, so
// that a takeover that reads the record again sees that it was renewed
// even where two renewals name the same moment.
func leaseRecord(epoch int, until time.Time, n int) []byte {
	b, _ := json.Marshal(Lease{Owner: Owner(), Epoch: epoch, Expires: until, Renewal: n})
	return b
}

// leaseView is a lease as found in storage: the names in its lease
// folder, the key of its highest epoch and what is stored there (no key:
// a saga's lease is its intent's).
type leaseView struct {
	names []string
	epoch int
	key   string
	raw   []byte
}

// readLease lists saga's journal folder and reads its highest lease key.
func (js *Journals) readLease(ctx context.Context, saga string) (leaseView, error) {
	return readFolderLease(ctx, js.storage, sagaLeases(saga))
}

// readFolderLease lists the lease folder f and reads its highest lease
// key. A key listed and not there is being written (the Redis module
// lists a key before it sets it), and read as empty.
func readFolderLease(ctx context.Context, s Storage, f leaseFolder) (leaseView, error) {
	names, err := listNames(ctx, s, f.dir)
	if err != nil {
		return leaseView{}, err
	}
	v := leaseView{names: names}
	epoch, keys := topLeases(names)
	if len(keys) == 0 {
		return v, nil
	}
	slices.Sort(keys)
	v.epoch, v.key = epoch, path.Join(f.dir, keys[0])
	v.raw, err = s.Load(ctx, v.key)
	if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	return v, err
}

// record is what a takeover watches of the lease (fence.go): its key's
// name and bytes, unchanged for as long as nobody renews it.
func (v leaseView) record() string { return v.key + "\x00" + string(v.raw) }

// lease decodes the view's lease; with no lease key, it is the one the
// intent was stored with.
func (v leaseView) lease(in *intent) Lease {
	var l Lease
	if v.raw != nil && json.Unmarshal(v.raw, &l) == nil {
		l.Epoch = v.epoch
	}
	if in != nil && v.epoch <= 0 {
		return in.heldBy(l)
	}
	return l
}

// leaseOf returns who holds saga and until when (by the holder's clock,
// for a listing): its highest lease key, else the intent's.
func (js *Journals) leaseOf(ctx context.Context, saga string) (Lease, error) {
	v, err := js.readLease(ctx, saga)
	if err != nil {
		return Lease{}, err
	}
	in, err := js.loadIntent(ctx, saga)
	if err != nil {
		return Lease{}, err
	}
	return v.lease(in), nil
}

// heldBy is who holds the saga whose epoch-0 lease key holds l: l while
// it stands, else the later of it and the lease the intent was stored
// with.
func (in *intent) heldBy(l Lease) Lease {
	if now().Before(l.Expires) || !in.Expires.After(l.Expires) {
		return l
	}
	return Lease{Owner: in.Owner, Expires: in.Expires}
}
