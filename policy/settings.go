package policy

import (
	"errors"
	"fmt"
	"time"
)

// Op is one of the four batch operations.
type Op uint8

// The batch operations, in the order the configuration lists them.
const (
	OpGet Op = iota
	OpCreate
	OpUpdate
	OpDelete
	opCount
)

var opNames = [opCount]string{"get", "create", "update", "delete"}

// String returns the operation's configuration name: get, create, update
// or delete.
func (o Op) String() string {
	if o < opCount {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", o)
}

// ParseOp parses an operation's configuration name.
func ParseOp(s string) (Op, error) {
	for i, n := range opNames {
		if n == s {
			return Op(i), nil
		}
	}
	return 0, fmt.Errorf("unknown batch operation %q (want get, create, update or delete)", s)
}

// Writes reports whether the operation changes the upstream's state, and
// so carries an Idempotency-Key and may need undoing.
func (o Op) Writes() bool { return o != OpGet }

// Atomicity says what a batch promises when one of its items fails.
type Atomicity uint8

const (
	// AllOrNothing undoes what a failed batch already did.
	AllOrNothing Atomicity = iota
	// Partial lets every item stand on its own.
	Partial
)

// String returns the configuration and wire name of the mode.
func (a Atomicity) String() string {
	if a == Partial {
		return "partial"
	}
	return "all_or_nothing"
}

// ParseAtomicity parses all_or_nothing or partial.
func ParseAtomicity(s string) (Atomicity, error) {
	switch s {
	case "all_or_nothing":
		return AllOrNothing, nil
	case "partial":
		return Partial, nil
	}
	return 0, fmt.Errorf("unknown atomicity %q (want all_or_nothing or partial)", s)
}

// DeleteSemantics says what a DELETE of a missing item means.
type DeleteSemantics uint8

const (
	// Imperative: "delete it"; a missing item is a 404 failure.
	Imperative DeleteSemantics = iota
	// Declarative: "it must not exist"; a missing item already satisfies it.
	Declarative
)

// ParseDeleteSemantics parses imperative or declarative.
func ParseDeleteSemantics(s string) (DeleteSemantics, error) {
	switch s {
	case "imperative":
		return Imperative, nil
	case "declarative":
		return Declarative, nil
	}
	return 0, fmt.Errorf("unknown delete_semantics %q (want imperative or declarative)", s)
}

// Restore says which request puts a pre-image back during compensation.
type Restore uint8

const (
	// RestorePut sends PUT <item path> with the pre-image.
	RestorePut Restore = iota
	// RestorePatch sends PATCH <item path> with the changed fields' old values.
	RestorePatch
	// RestorePost sends POST <collection> with the pre-image, id included,
	// for APIs whose PUT cannot create.
	RestorePost
)

// String returns the configuration name.
func (r Restore) String() string {
	switch r {
	case RestorePatch:
		return "patch"
	case RestorePost:
		return "post"
	}
	return "put"
}

// ParseRestoreDeleted parses restore_deleted: put or post.
func ParseRestoreDeleted(s string) (Restore, error) {
	switch s {
	case "put":
		return RestorePut, nil
	case "post":
		return RestorePost, nil
	}
	return 0, fmt.Errorf("unknown restore_deleted %q (want put or post)", s)
}

// ParseRestoreUpdated parses restore_updated: put or patch.
func ParseRestoreUpdated(s string) (Restore, error) {
	switch s {
	case "put":
		return RestorePut, nil
	case "patch":
		return RestorePatch, nil
	}
	return 0, fmt.Errorf("unknown restore_updated %q (want put or patch)", s)
}

// Settings are the tunables of batch handling, resolved for one resource:
// the handler's values over the defaults, the resource's over those.
type Settings struct {
	Atomicity           [opCount]Atomicity
	AllowOverride       bool
	MaxItems            int
	MaxBodySize         int64
	Concurrency         int
	ItemTimeout         time.Duration
	BatchTimeout        time.Duration
	IDsParam            string
	IDField             string
	DeleteSemantics     DeleteSemantics
	RestoreDeleted      Restore
	RestoreUpdated      Restore
	CompensationRetries int
	CompensationTimeout time.Duration
	// IdempotentUpstream says the upstream honours Idempotency-Key, so a
	// write whose outcome is unknown may be sent again with the same key
	// to learn it.
	IdempotentUpstream bool
	ItemLocks          ItemLocks
	MaxResponseSize    int64
	MaxInFlight        int
}

// ItemLocks says where the locks a saga takes on its items live.
type ItemLocks uint8

const (
	// LocalLocks lock items within one Caddy process.
	LocalLocks ItemLocks = iota
	// StorageLocks lock items through Caddy's storage, across instances.
	StorageLocks
)

// String returns the configuration name.
func (l ItemLocks) String() string {
	if l == StorageLocks {
		return "storage"
	}
	return "local"
}

// ParseItemLocks parses item_locks: local or storage.
func ParseItemLocks(s string) (ItemLocks, error) {
	switch s {
	case "local":
		return LocalLocks, nil
	case "storage":
		return StorageLocks, nil
	}
	return 0, fmt.Errorf("unknown item_locks %q (want local or storage)", s)
}

// Defaults returns the settings SPEC section 3 gives for an option that
// is not configured.
func Defaults() Settings {
	return Settings{
		MaxItems:            100,
		MaxBodySize:         1 << 20,
		Concurrency:         8,
		ItemTimeout:         10 * time.Second,
		BatchTimeout:        30 * time.Second,
		IDsParam:            "ids",
		IDField:             "id",
		DeleteSemantics:     Imperative,
		RestoreDeleted:      RestorePut,
		RestoreUpdated:      RestorePut,
		CompensationRetries: 3,
		CompensationTimeout: 30 * time.Second,
		ItemLocks:           LocalLocks,
		MaxResponseSize:     16 << 20,
		MaxInFlight:         32,
	}
}

// SetAtomicity sets the mode of every operation.
func (s *Settings) SetAtomicity(a Atomicity) {
	for i := range s.Atomicity {
		s.Atomicity[i] = a
	}
}

// Validate refuses settings that cannot work, naming the option.
func (s Settings) Validate() error {
	var errs []error
	positive := func(name string, ok bool) {
		if !ok {
			errs = append(errs, fmt.Errorf("%s must be greater than zero", name))
		}
	}
	positive("max_items", s.MaxItems > 0)
	positive("max_body_size", s.MaxBodySize > 0)
	positive("concurrency", s.Concurrency > 0)
	positive("item_timeout", s.ItemTimeout > 0)
	positive("batch_timeout", s.BatchTimeout > 0)
	positive("compensation_timeout", s.CompensationTimeout > 0)
	positive("max_response_size", s.MaxResponseSize > 0)
	positive("max_in_flight", s.MaxInFlight > 0)
	if s.CompensationRetries < 0 {
		errs = append(errs, errors.New("compensation_retries must not be negative"))
	}
	if s.IDsParam == "" {
		errs = append(errs, errors.New("ids_param must not be empty"))
	}
	if s.IDsParam == "_method" {
		errs = append(errs, errors.New(`ids_param must not be "_method": the gateway reads that parameter as a method override; choose another name, e.g. ids`))
	}
	if s.IDField == "" {
		errs = append(errs, errors.New("id_field must not be empty"))
	}
	return errors.Join(errs...)
}
