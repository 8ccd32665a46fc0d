package batchapp

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/caddy-batch/caddy-batch/durable"
)

// The operator's commands of bulk jobs (docs/jobs.md, "Operations"):
// caddy batch jobs, job and cancel, each a request to the admin
// endpoint, as the sagas' are.

// Exit statuses of a watched job (caddy batch job --watch) that ended
// short of every item succeeding: 3 when items are left behind, as a
// retry that left items; 4 when it ended otherwise (partial, failed,
// rolled_back, cancelled), so that a script can tell both from an
// error (1).
const (
	exitJobLeftBehind = exitLeftBehind
	exitJobNotAll     = 4
)

// defaultWatchInterval is how often a watch polls the job's status.
const defaultWatchInterval = time.Second

func jobCommands() []*cobra.Command {
	return cobraCommands([]subcommand{
		{"jobs", "Lists the bulk jobs, newest first", 0, cmdJobs, func(fs *pflag.FlagSet) {
			fs.String("state", "", "only the jobs in this state: "+strings.Join(durable.JobStates, ", "))
			fs.Int("limit", defaultSagaLimit, "at most this many")
			fs.String("after", "", "the page after this job's id")
		}},
		{"job <id>", "Shows a bulk job's status, or watches it to its end", 1, cmdJob, func(fs *pflag.FlagSet) {
			fs.Bool("watch", false, "poll the job until it ends: a progress bar on a terminal, a line a poll otherwise (a JSON status a line with --json); exit 3 if it ended rollback_failed, 4 if it ended partial, failed, rolled_back or cancelled")
			fs.Duration("interval", defaultWatchInterval, "how often --watch polls the job")
		}},
		{"cancel <id>", "Cancels a bulk job: it starts no new item, and ends", 1, cmdCancel, nil},
	})
}

func cmdJobs(fl caddycmd.Flags, _ string, w io.Writer) (int, error) {
	var list []durable.JobStatus
	if code, err := adminCall(fl, w, http.MethodGet, listURI(fl, "/batch/jobs"), nil, &list); err != nil {
		return code, err
	}
	if !fl.Bool("json") {
		printJobs(w, list)
	}
	return caddy.ExitCodeSuccess, nil
}

func cmdJob(fl caddycmd.Flags, id string, w io.Writer) (int, error) {
	uri := "/batch/jobs/" + url.PathEscape(id)
	watch, _ := fl.GetBool("watch")
	if !watch {
		var st durable.JobStatus
		if code, err := adminCall(fl, w, http.MethodGet, uri, nil, &st); err != nil {
			return code, err
		}
		if !fl.Bool("json") {
			printJob(w, &st)
		}
		return caddy.ExitCodeSuccess, nil
	}
	every, _ := fl.GetDuration("interval")
	if every <= 0 {
		return caddy.ExitCodeFailedStartup, fmt.Errorf("--interval %s is not a positive duration, e.g. --interval 1s", every)
	}
	addr, err := adminAddress(fl)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	poll := func() (*durable.JobStatus, []byte, error) {
		var st durable.JobStatus
		raw, err := adminAt(addr, http.MethodGet, uri, nil, &st)
		return &st, raw, err
	}
	st, err := watchJob(poll, displayFor(w, fl.Bool("json")), every, wallClock)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	return jobExit(st), nil
}

func cmdCancel(fl caddycmd.Flags, id string, w io.Writer) (int, error) {
	var st durable.JobStatus
	if code, err := adminCall(fl, w, http.MethodPost, "/batch/jobs/"+url.PathEscape(id)+"/cancel", nil, &st); err != nil {
		return code, err
	}
	if !fl.Bool("json") {
		fmt.Fprintf(w, "%s %s (%d of %d items done)\n", st.State, st.ID, st.Done, st.Items)
	}
	return caddy.ExitCodeSuccess, nil
}

// jobExit is the exit status of a watch that saw the job end as st.
func jobExit(st *durable.JobStatus) int {
	switch st.State {
	case durable.JobSucceeded:
		return caddy.ExitCodeSuccess
	case durable.JobRollbackFailed:
		return exitJobLeftBehind
	}
	return exitJobNotAll
}

// jobDisplay is how a watch shows each status it polled, at the time
// it polled it, and the status the job ended with.
type jobDisplay interface {
	show(st *durable.JobStatus, raw []byte, at time.Time)
	end(st *durable.JobStatus)
}

// clock is the time a watch reads and waits on.
type clock struct {
	now   func() time.Time
	sleep func(time.Duration)
}

var wallClock = clock{now: time.Now, sleep: time.Sleep}

// watchJob polls the job every interval until it ended, showing each
// status on d, and answers the last one. An error of a poll (the job
// removed, the admin endpoint gone) ends it.
func watchJob(poll func() (*durable.JobStatus, []byte, error), d jobDisplay, every time.Duration, c clock) (*durable.JobStatus, error) {
	for {
		st, raw, err := poll()
		if err != nil {
			return nil, err
		}
		d.show(st, raw, c.now())
		if st.Ended != nil {
			d.end(st)
			return st, nil
		}
		c.sleep(every)
	}
}

// displayFor is a watch's display on w: the statuses as they came with
// asJSON, a progress bar on a terminal, else a line a poll.
func displayFor(w io.Writer, asJSON bool) jobDisplay {
	switch {
	case asJSON:
		return jsonLines{w}
	case isTerminal(w):
		return &barDisplay{w: w}
	}
	return &plainLines{w: w}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// jsonLines writes each status as the admin API answered it, one JSON
// object a line (JSON Lines).
type jsonLines struct{ w io.Writer }

func (j jsonLines) show(_ *durable.JobStatus, raw []byte, _ time.Time) { _, _ = j.w.Write(raw) }
func (jsonLines) end(*durable.JobStatus)                               {}

// plainLines writes a line a poll, for a log or a pipe:
//
//	2026-11-28T22:13:39Z running 1200/50000 done, 1190 succeeded, 10 failed, 312 items/s
//
// and the end's line names the outcome, and the reason if there is one.
type plainLines struct {
	w    io.Writer
	rate rateMeter
}

func (p *plainLines) show(st *durable.JobStatus, _ []byte, at time.Time) {
	p.rate.add(at, st.Done)
	line := fmt.Sprintf("%s %s %d/%d done, %d succeeded, %d failed", at.UTC().Format(time.RFC3339), st.State, st.Done, st.Items, st.Succeeded, st.Failed)
	if r, ok := p.rate.perSecond(); ok && st.Ended == nil {
		line += fmt.Sprintf(", %.0f items/s", r)
	}
	if st.Ended != nil {
		line += ", ended: outcome " + orNone(st.Outcome)
	}
	if st.Reason != "" {
		line += " (" + st.Reason + ")"
	}
	fmt.Fprintln(p.w, line)
}

func (*plainLines) end(*durable.JobStatus) {}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// barDisplay draws a progress bar on a terminal: done of items, items a
// second, time left; the status whole once the job ended.
type barDisplay struct {
	w    io.Writer
	bar  *progressbar.ProgressBar
	rate rateMeter
}

func (b *barDisplay) show(st *durable.JobStatus, _ []byte, at time.Time) {
	if b.bar == nil {
		b.bar = progressbar.NewOptions64(int64(max(st.Items, 1)),
			progressbar.OptionSetWriter(b.w),
			progressbar.OptionSetWidth(30),
			progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(false),
			progressbar.OptionShowDescriptionAtLineEnd(),
			progressbar.OptionSetRenderBlankState(true))
	}
	b.rate.add(at, st.Done)
	b.bar.Describe(b.rate.describe(st))
	_ = b.bar.Set(st.Done)
}

func (b *barDisplay) end(st *durable.JobStatus) {
	_ = b.bar.Exit()
	fmt.Fprint(b.w, "\n\n")
	printJob(b.w, st)
}

// rateMeter measures items a second over the polls of the last
// rateWindow: the bar's own rate would count the items done before the
// watch began as done in its first second.
type rateMeter struct {
	samples []rateSample
}

type rateSample struct {
	at   time.Time
	done int
}

const rateWindow = 10 * time.Second

func (m *rateMeter) add(at time.Time, done int) {
	m.samples = append(m.samples, rateSample{at, done})
	for len(m.samples) > 2 && at.Sub(m.samples[0].at) > rateWindow {
		m.samples = m.samples[1:]
	}
}

// perSecond is the rate of the window; ok is false before two polls.
func (m *rateMeter) perSecond() (float64, bool) {
	if len(m.samples) < 2 {
		return 0, false
	}
	first, last := m.samples[0], m.samples[len(m.samples)-1]
	secs := last.at.Sub(first.at).Seconds()
	if secs <= 0 {
		return 0, false
	}
	return float64(last.done-first.done) / secs, true
}

// describe is the bar's text: the state, items a second and time left
// once they can be told.
func (m *rateMeter) describe(st *durable.JobStatus) string {
	text := st.State
	r, ok := m.perSecond()
	if !ok {
		return text
	}
	text += fmt.Sprintf(", %.0f items/s", r)
	if r > 0 && st.Ended == nil {
		left := time.Duration(float64(st.Items-st.Done) / r * float64(time.Second))
		text += ", " + left.Round(time.Second).String() + " left"
	}
	return text
}

func printJobs(w io.Writer, list []durable.JobStatus) {
	if len(list) == 0 {
		fmt.Fprintln(w, "no jobs")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tCREATED\tOP\tRESOURCE\tDONE\tSUCCEEDED\tFAILED\tREASON")
	for _, st := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d/%d\t%d\t%d\t%s\n", st.ID, st.State, st.Created.Local().Format(time.DateTime),
			st.Op, st.Resource, st.Done, st.Items, st.Succeeded, st.Failed, cut(st.Reason, 80))
	}
	_ = tw.Flush()
}

func printJob(w io.Writer, st *durable.JobStatus) {
	fmt.Fprintf(w, "job        %s\nstate      %s\nbatch      %s %s (%s)\nitems      %d done of %d: %d succeeded, %d failed\ncreated    %s\n",
		st.ID, st.State, st.Op, st.Resource, st.Atomicity, st.Done, st.Items, st.Succeeded, st.Failed, st.Created.Local().Format(time.DateTime))
	for _, t := range []struct {
		name string
		at   *time.Time
	}{{"started", st.Started}, {"ended", st.Ended}, {"expires", st.Expires}} {
		if t.at != nil {
			fmt.Fprintf(w, "%-10s %s\n", t.name, t.at.Local().Format(time.DateTime))
		}
	}
	if st.Outcome != "" {
		fmt.Fprintf(w, "outcome    %s\n", st.Outcome)
	}
	if st.Reason != "" {
		fmt.Fprintf(w, "reason     %s\n", st.Reason)
	}
	if st.Takeovers > 0 {
		fmt.Fprintf(w, "takeovers  %d\n", st.Takeovers)
	}
	fmt.Fprintf(w, "results    %s (with the job's token)\n", st.Results)
}
