package batchapp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/caddy-batch/caddy-batch/durable"
)

// The operator's commands (docs/operations.md, "Sagas left behind"): caddy batch sagas,
// saga, retry and resolve, each a request to the admin endpoint of a
// running Caddy, found as caddy reload finds it.
func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "batch",
		Usage: "sagas|saga|retry|resolve|jobs|job|cancel",
		Short: "Operates the sagas and the bulk jobs of batch",
		Long: `
Operates the all-or-nothing batches that left items behind (kept sagas),
the journals that are running, orphaned or stuck, and the bulk jobs,
through the admin endpoint of a running Caddy (--address, else the
config's, else localhost:2019). Every subcommand takes --json for the
admin API's own answer. Exit status: 0 when done, 1 on an error, 3 when
a retry ran and items are still left behind, or a watched job ended
rollback_failed; 4 when a watched job ended partial, failed, rolled_back
or cancelled.`,
		CobraFunc: func(cmd *cobra.Command) {
			for _, sub := range append(sagaCommands(), jobCommands()...) {
				cmd.AddCommand(sub)
			}
		},
	})
}

// exitLeftBehind is the exit status of a retry that left items behind.
const exitLeftBehind = 3

// subcommand is a caddy batch subcommand: its usage, how many
// arguments it takes, what it does, and its own flags besides
// adminFlags.
type subcommand struct {
	use, short string
	args       int
	run        func(fl caddycmd.Flags, id string, w io.Writer) (int, error)
	flags      func(*pflag.FlagSet)
}

func sagaCommands() []*cobra.Command {
	return cobraCommands([]subcommand{
		{"sagas", "Lists the sagas, newest first", 0, cmdSagas, func(fs *pflag.FlagSet) {
			fs.String("state", "", "only the sagas in this state: running, orphaned, stuck or left_behind")
			fs.Int("limit", defaultSagaLimit, "at most this many")
			fs.String("after", "", "the page after this saga's id")
		}},
		{"saga <id>", "Shows a saga whole", 1, cmdSaga, nil},
		{"retry <id>", "Undoes again what a saga left behind, under the current config", 1, cmdRetry, func(fs *pflag.FlagSet) {
			fs.StringArray("header", nil, `a header its requests carry, "Name: value" (repeatable): the credentials the kept saga no longer holds`)
		}},
		{"resolve <id>", "Closes a saga repaired by hand", 1, cmdResolve, func(fs *pflag.FlagSet) {
			fs.String("reason", "", "what was done, for the audit line (required)")
		}},
	})
}

func cobraCommands(defs []subcommand) []*cobra.Command {
	var out []*cobra.Command
	for _, d := range defs {
		c := &cobra.Command{Use: d.use, Short: d.short, Args: cobra.ExactArgs(d.args), SilenceUsage: true, SilenceErrors: true}
		adminFlags(c.Flags())
		if d.flags != nil {
			d.flags(c.Flags())
		}
		c.RunE = caddycmd.WrapCommandFuncForCobra(func(fl caddycmd.Flags) (int, error) {
			return d.run(fl, fl.Arg(0), c.OutOrStdout())
		})
		out = append(out, c)
	}
	return out
}

// adminFlags are the flags of every subcommand: where the admin
// endpoint is, and how to answer.
func adminFlags(fs *pflag.FlagSet) {
	fs.String("address", "", "the admin endpoint's address (default: the config's, else localhost:2019)")
	fs.StringP("config", "c", "", "the config file to read the admin endpoint's address from")
	fs.StringP("adapter", "a", "", "the name of the config adapter to use")
	fs.Bool("json", false, "print the admin API's JSON answer")
}

// listURI is the admin API's listing at path, with the flags' state,
// limit and after.
func listURI(fl caddycmd.Flags, path string) string {
	q := url.Values{}
	if s := fl.String("state"); s != "" {
		q.Set("state", s)
	}
	if n, _ := fl.GetInt("limit"); n != defaultSagaLimit {
		q.Set("limit", fmt.Sprint(n))
	}
	if s := fl.String("after"); s != "" {
		q.Set("after", s)
	}
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	return path
}

func cmdSagas(fl caddycmd.Flags, _ string, w io.Writer) (int, error) {
	var list []durable.Summary
	if code, err := adminCall(fl, w, http.MethodGet, listURI(fl, "/batch/sagas"), nil, &list); err != nil {
		return code, err
	}
	if !fl.Bool("json") {
		printSagas(w, list)
	}
	return caddy.ExitCodeSuccess, nil
}

func cmdSaga(fl caddycmd.Flags, id string, w io.Writer) (int, error) {
	var v durable.SagaView
	if code, err := adminCall(fl, w, http.MethodGet, "/batch/sagas/"+url.PathEscape(id), nil, &v); err != nil {
		return code, err
	}
	if !fl.Bool("json") {
		printSaga(w, &v)
	}
	return caddy.ExitCodeSuccess, nil
}

func cmdRetry(fl caddycmd.Flags, id string, w io.Writer) (int, error) {
	headers, _ := fl.GetStringArray("header")
	body := retryBody{Headers: map[string]string{}}
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return caddy.ExitCodeFailedStartup, fmt.Errorf(`--header %q is not "Name: value"`, h)
		}
		body.Headers[strings.TrimSpace(name)] = strings.TrimSpace(value)
	}
	var v durable.SagaView
	if code, err := adminCall(fl, w, http.MethodPost, "/batch/sagas/"+url.PathEscape(id)+"/retry", body, &v); err != nil {
		return code, err
	}
	if !fl.Bool("json") {
		printSaga(w, &v)
	}
	if v.State == durable.StateLeftBehind {
		return exitLeftBehind, nil
	}
	return caddy.ExitCodeSuccess, nil
}

func cmdResolve(fl caddycmd.Flags, id string, w io.Writer) (int, error) {
	reason := fl.String("reason")
	if strings.TrimSpace(reason) == "" {
		return caddy.ExitCodeFailedStartup, errors.New(`resolve needs --reason "what was done", for the audit line`)
	}
	var v durable.SagaView
	if code, err := adminCall(fl, w, http.MethodPost, "/batch/sagas/"+url.PathEscape(id)+"/resolve", resolveBody{Reason: reason}, &v); err != nil {
		return code, err
	}
	if !fl.Bool("json") {
		fmt.Fprintf(w, "resolved %s (%d items, %d left behind)\n", v.ID, len(v.Items), len(v.LeftBehind))
	}
	return caddy.ExitCodeSuccess, nil
}

// adminCall sends a request to the admin endpoint and decodes its JSON
// answer into v; with --json it prints the answer as it came. A refusal
// is an error with the problem's detail.
func adminCall(fl caddycmd.Flags, w io.Writer, method, uri string, body, v any) (int, error) {
	addr, err := adminAddress(fl)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	raw, err := adminAt(addr, method, uri, body, v)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	if fl.Bool("json") {
		_, _ = w.Write(raw)
	}
	return caddy.ExitCodeSuccess, nil
}

// adminAddress is the admin endpoint's address, as caddy reload finds
// it.
func adminAddress(fl caddycmd.Flags) (string, error) {
	config, file, err := configToRead(fl)
	if err != nil {
		return "", err
	}
	addr, err := caddycmd.DetermineAdminAPIAddress(fl.String("address"), config, file, fl.String("adapter"))
	if err != nil {
		return "", fmt.Errorf("finding the admin endpoint: %v", err)
	}
	return addr, nil
}

// adminAt sends a request to the admin endpoint at addr and decodes its
// JSON answer into v, answering it as it came. A refusal is an error
// with the problem's detail.
func adminAt(addr, method, uri string, body, v any) ([]byte, error) {
	var reader io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		reader = bytes.NewReader(b)
	}
	resp, err := caddycmd.AdminAPIRequest(addr, method, uri, nil, reader)
	if err != nil {
		return nil, fmt.Errorf("%s %s at %s: %s", method, uri, addr, problemDetail(err))
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err == nil {
		err = json.Unmarshal(raw, v)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the answer of %s %s: %v", method, uri, err)
	}
	return raw, nil
}

// configToRead is the config that names the admin endpoint, as caddy
// reload reads it: --config, else a Caddyfile in the current folder;
// none is no error (the default address then).
func configToRead(fl caddycmd.Flags) ([]byte, string, error) {
	if fl.String("address") != "" {
		return nil, "", nil
	}
	config, file, _, err := caddycmd.LoadConfig(fl.String("config"), fl.String("adapter"))
	return config, file, err
}

// problemDetail is the detail of the problem an admin request was
// refused with, or the error as it is.
func problemDetail(err error) string {
	msg := err.Error()
	i := strings.Index(msg, "{")
	var p struct {
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	if i < 0 || json.Unmarshal([]byte(msg[i:]), &p) != nil || p.Detail == "" {
		return msg
	}
	return fmt.Sprintf("%d: %s", p.Status, p.Detail)
}

func printSagas(w io.Writer, list []durable.Summary) {
	if len(list) == 0 {
		fmt.Fprintln(w, "no sagas")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tSTARTED\tREQUEST\tITEMS\tLEFT\tREASON")
	for _, s := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s %s\t%d\t%d\t%s\n", s.ID, s.State, s.Started.Local().Format(time.DateTime),
			s.Method, s.URI, s.Items, s.LeftBehind, s.Reason)
	}
	_ = tw.Flush()
}

func printSaga(w io.Writer, v *durable.SagaView) {
	fmt.Fprintf(w, "saga     %s\nstate    %s\nrequest  %s %s (host %s, server %s)\nstarted  %s\n",
		v.ID, v.State, v.Method, v.URI, v.Host, v.Server, v.Started.Local().Format(time.DateTime))
	if v.Reason != "" {
		fmt.Fprintf(w, "reason   %s\n", v.Reason)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nITEM\tID\tOUTCOME\tWHY LEFT\tPRE-IMAGE")
	for _, it := range v.Items {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", it.Index, it.ID, it.Outcome, cut(it.Reason, 80), cut(string(it.Preimage), 60))
	}
	_ = tw.Flush()
}

// cut shortens s for a table; --json gives it whole.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
