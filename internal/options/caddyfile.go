package options

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"

	"github.com/caddy-batch/caddy-batch/policy"
)

// Once refuses a subdirective or option written twice in one block:
// which one would win is not something a reader should have to know.
func Once(d *caddyfile.Dispenser, seen map[string]caddyfile.Token, key string, tok caddyfile.Token) error {
	if prev, ok := seen[key]; ok {
		return d.Errf("%s is set twice (lines %d and %d): keep one", key, prev.Line, tok.Line)
	}
	seen[key] = tok
	return nil
}

// optionNamed is the row of the option name names.
func optionNamed(name string) (*option, bool) {
	for i := range optionTable {
		if optionTable[i].name == name {
			return &optionTable[i], true
		}
	}
	return nil, false
}

// unknownOption refuses a word that is no option, naming the one it
// most likely misspells, or else every word the block takes.
func unknownOption(d *caddyfile.Dispenser, name string, words []string) error {
	for _, o := range optionTable {
		words = append(words, o.name)
	}
	if n := policy.Nearest(name, words); n != "" {
		return d.Errf("unknown batch option %q: did you mean %s?", name, n)
	}
	return d.Errf("unknown batch option %q (this block takes %s)", name, strings.Join(words, ", "))
}

// UnmarshalOption sets the option the dispenser is on, from its
// Caddyfile line. words are the
// other words its block takes, for the error about an unknown one.
func (o *Options) UnmarshalOption(d *caddyfile.Dispenser, seen map[string]caddyfile.Token, words []string) error {
	name, tok, args := d.Val(), d.Token(), d.RemainingArgs()
	opt, known := optionNamed(name)
	key := name
	if known && opt.key != nil {
		key = opt.key(args)
	}
	if err := Once(d, seen, key, tok); err != nil {
		return err
	}
	if !known {
		return unknownOption(d, name, words)
	}
	return opt.read(o, optionArgs{d: d, opt: opt, args: args})
}

// optionArgs are the values an option is written with, read as the kind
// of value the option takes.
type optionArgs struct {
	d    *caddyfile.Dispenser
	opt  *option
	args []string
}

// example is a line that sets the option.
func (a optionArgs) example() string { return a.opt.name + " " + a.opt.example }

func (a optionArgs) one() (string, error) {
	if len(a.args) != 1 {
		return "", a.d.Errf("%s takes one value, e.g. %s", a.opt.name, a.example())
	}
	if a.args[0] == "" {
		return "", a.d.Errf("%s takes a value, not an empty string, e.g. %s", a.opt.name, a.example())
	}
	return a.args[0], nil
}

// limit refuses a zero: it cannot reach resolve (in JSON it means "the
// default"), so it is refused here, with the policy's own rule; resolve
// judges every other value.
func (a optionArgs) limit(n int64) error {
	if n != 0 {
		return nil
	}
	if err := policy.CheckLimit(a.opt.name, n); err != nil {
		return a.d.Err(err.Error())
	}
	return nil
}

// parsed reads the option's one value with parse; a value parse
// refuses is answered "<option> takes <what>, not <value>".
func parsed[T any](a optionArgs, parse func(string) (T, error), what string) (T, error) {
	v, err := a.one()
	if err != nil {
		var zero T
		return zero, err
	}
	x, err := parse(v)
	if err != nil {
		return x, a.d.Errf("%s takes %s, not %q", a.opt.name, what, v)
	}
	return x, nil
}

func (a optionArgs) number(dst *int) error {
	n, err := parsed(a, strconv.Atoi, "a whole number, e.g. "+a.example())
	if err != nil {
		return err
	}
	*dst = n
	return a.limit(int64(n))
}

func (a optionArgs) duration(dst *caddy.Duration) error {
	dur, err := parsed(a, caddy.ParseDuration, "a duration such as 10s, 1m30s or 2h")
	if err != nil {
		return err
	}
	*dst = caddy.Duration(dur)
	return a.limit(int64(dur))
}

// pause reads a duration that may be zero (which turns a wait off).
func (a optionArgs) pause(dst **caddy.Duration) error {
	dur, err := parsed(a, func(v string) (time.Duration, error) {
		dur, err := caddy.ParseDuration(v)
		if err == nil && dur < 0 {
			err = errors.New("a negative pause")
		}
		return dur, err
	}, "a duration such as 5s or 0 (off)")
	if err != nil {
		return err
	}
	d := caddy.Duration(dur)
	*dst = &d
	return nil
}

func (a optionArgs) size(dst *int64) error {
	n, err := parsed(a, humanize.ParseBytes, "a size such as 1MiB, 512KiB or 1048576 (bytes)")
	if err != nil {
		return err
	}
	if n > 1<<62 {
		return a.d.Errf("%s %s is more than any machine holds: give a size such as 1MiB", a.opt.name, a.args[0])
	}
	*dst = int64(n)
	return a.limit(int64(n))
}

func (a optionArgs) text(dst *string) (err error) {
	*dst, err = a.one()
	return err
}

// flag reads an option that is on when named alone.
func (a optionArgs) flag(dst **bool) error {
	on := true
	switch {
	case len(a.args) == 1 && a.args[0] == "off":
		on = false
	case len(a.args) > 1 || len(a.args) == 1 && a.args[0] != "on":
		return a.d.Errf("%s takes no value, or on or off, not %q", a.opt.name, strings.Join(a.args, " "))
	}
	*dst = &on
	return nil
}
