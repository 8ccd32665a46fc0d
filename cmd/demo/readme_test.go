package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-batch/caddy-batch/durable"
	"github.com/caddyserver/caddy/v2"
)

// sessionDocs are the documents whose console blocks make the demo's
// session, in the order it runs them: the README's worked example, the
// tour, and the worked example of the sagas left behind.
var sessionDocs = []string{"../../README.md", "../../docs/tour.md", "../../docs/operations.md"}

// TestReadmeSession runs every curl command of the console blocks of the
// README, docs/tour.md and docs/operations.md, in order, against the demo
// (Caddyfile.example in front of the demo legacy API), and checks that
// the answer is the one the document shows: the status line and headers
// shown for curl -i, and the body, compared as JSON (JSON Lines value by
// value). The tour's bulk job is read as its reader would: its status
// again until the job has ended, its id and token in place of <job> and
// <token> (jobPlaceholders). The documents' demo cannot drift from what
// it does.
func TestReadmeSession(t *testing.T) {
	var steps []step
	for _, path := range sessionDocs {
		steps = append(steps, readmeSession(t, path)...)
	}
	if len(steps) < 10 {
		t.Fatalf("found %d curl steps in %v; the demo session is missing", len(steps), sessionDocs)
	}
	d := startDemo(t)
	gateway := d.gateway
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, s := range steps {
		t.Run(s.command, func(t *testing.T) {
			if strings.HasPrefix(s.command, "caddy ") {
				d.caddy(t, s)
				return
			}
			s.command = d.job.expand(s.command)
			resp, body := s.send(t, client, gateway)
			for deadline := time.Now().Add(20 * time.Second); s.watchesJob() && jobRunning(body) && time.Now().Before(deadline); {
				// As the tour's reader does: the status again, until the
				// job has ended (sooner than its Retry-After, for the test).
				time.Sleep(50 * time.Millisecond)
				resp, body = s.send(t, client, gateway)
			}
			s.check(t, resp, body, &d.job)
		})
	}
}

// send sends the step's request and reads its answer.
func (s step) send(t *testing.T, client *http.Client, gateway string) (*http.Response, []byte) {
	resp, err := client.Do(s.request(t, gateway))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, body
}

// startDemo serves Caddyfile.example as the demo does, on free ports
// (the admin endpoint's included).
func startDemo(t testing.TB) *demo {
	raw, err := os.ReadFile("../../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	// Sagas keep their journals in Caddy's default storage, where every
	// Caddy of the same user (another test run included) looks for
	// journals to finish: this run's must be its own.
	caddy.DefaultStorage.Path = t.TempDir()
	t.Cleanup(func() {
		// A saga answered once its end marker is stored deletes the rest
		// of its journal after: let it end before the directory goes and
		// the next test points the default storage elsewhere.
		for deadline := time.Now().Add(10 * time.Second); durable.Pending() > 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
	})
	gateway := freeAddr(t)
	_, port, _ := net.SplitHostPort(gateway)
	if !bytes.Contains(raw, []byte("\n:8080 {")) {
		t.Fatal("Caddyfile.example no longer serves :8080, as the README says")
	}
	if !bytes.Contains(raw, []byte("\tadmin localhost:2019\n")) {
		t.Fatal("Caddyfile.example no longer turns the admin endpoint on at localhost:2019, as docs/operations.md says")
	}
	dir := t.TempDir()
	d := &demo{gateway: gateway, admin: freeAddr(t), config: filepath.Join(dir, "Caddyfile")}
	raw = bytes.Replace(raw, []byte("\n:8080 {"), []byte("\n:"+port+" {"), 1)
	raw = bytes.Replace(raw, []byte("admin localhost:2019"), []byte("admin "+d.admin), 1)
	config := d.config
	// The OpenAPI document the Caddyfile names, where it names it: a
	// relative name is taken from the Caddyfile's directory.
	if err := os.MkdirAll(filepath.Join(dir, "cmd", "demo"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cmd", "demo", "legacy-openapi.yaml"), legacyOpenAPI, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(config, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	stop, err := start(config, freeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	return d
}

func freeAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// step is one "$ curl ..." of a document and the output it shows.
type step struct {
	command string
	output  string
}

// readmeSession collects the steps of every ```console block of the
// document at path.
func readmeSession(t *testing.T, path string) []step {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var steps []step
	inBlock, continued := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "```console":
			inBlock = true
		case inBlock && line == "```":
			inBlock = false
		case !inBlock:
		case continued:
			steps[len(steps)-1].command += " " + strings.TrimSuffix(strings.TrimSpace(line), `\`)
			continued = strings.HasSuffix(line, `\`)
		case strings.HasPrefix(line, "$ "):
			steps = append(steps, step{command: strings.TrimSuffix(line[2:], `\`)})
			continued = strings.HasSuffix(line, `\`)
		case len(steps) == 0:
			t.Fatalf("%s: output before any command in a console block: %q", path, line)
		default:
			steps[len(steps)-1].output += line + "\n"
		}
	}
	return steps
}

// request builds the request a step's curl command sends, to the gateway
// in place of localhost:8080 (the Host header stays localhost:8080, so
// absolute Location headers read as in the documents).
func (s step) request(t *testing.T, gateway string) *http.Request {
	command, _ := s.piped()
	args := shellWords(t, command)
	if len(args) == 0 || args[0] != "curl" {
		t.Fatalf("the console blocks hold only curl and caddy commands, not %q", s.command)
	}
	method, target, data := "", "", ""
	var header []string
	for i := 1; i < len(args); i++ {
		switch a := args[i]; a {
		case "-s", "-i", "-si":
		case "-sI", "-I":
			method = http.MethodHead
		case "-X", "-H", "-d":
			if i+1 == len(args) {
				t.Fatalf("%s without a value", a)
			}
			i++
			switch a {
			case "-X":
				method = args[i]
			case "-H":
				header = append(header, args[i])
			case "-d":
				data = args[i]
			}
		default:
			if strings.HasPrefix(a, "-") || target != "" {
				t.Fatalf("the session does not know the curl argument %q", a)
			}
			target = a
		}
	}
	if method == "" {
		method = http.MethodGet
		if data != "" {
			method = http.MethodPost
		}
	}
	u, err := url.Parse("http://" + target)
	if err != nil || u.Host != "localhost:8080" {
		t.Fatalf("curl target %q is not on localhost:8080", target)
	}
	u.Host = gateway
	var body io.Reader
	if data != "" {
		body = strings.NewReader(data)
	}
	req, err := http.NewRequest(method, u.String(), body)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "localhost:8080"
	for _, h := range header {
		name, value, _ := strings.Cut(h, ":")
		req.Header.Set(name, strings.TrimSpace(value))
	}
	if data != "" && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded") // as curl -d sends
	}
	return req
}

// check compares the answer with the step's output, the tour's job
// placeholders (<job>, <token>, <time>, ...: jobPlaceholders) read as
// job says.
func (s step) check(t *testing.T, resp *http.Response, body []byte, job *jobPlaceholders) {
	want := s.output
	job.learn(want, body)
	want = job.expand(want)
	if strings.HasPrefix(want, "HTTP/") {
		head, rest, _ := strings.Cut(want, "\n\n")
		lines := strings.Split(head, "\n")
		fields := strings.Fields(lines[0])
		if len(fields) < 2 || fields[1] != strconv.Itoa(resp.StatusCode) {
			t.Errorf("status %d, the document shows %q", resp.StatusCode, lines[0])
		}
		for _, l := range lines[1:] {
			name, value, _ := strings.Cut(l, ":")
			if got := resp.Header.Get(name); got != strings.TrimSpace(value) {
				t.Errorf("header %s: %q, the document shows %q", name, got, strings.TrimSpace(value))
			}
		}
		want = rest
	}
	want = strings.TrimSpace(want)
	if want == "" {
		if len(body) != 0 {
			t.Errorf("body %s, the document shows none", body)
		}
		return
	}
	if _, jq := s.piped(); jq {
		// What jq prints, byte for byte: the document shows what a reader
		// sees.
		var pretty bytes.Buffer
		if err := json.Indent(&pretty, body, "", "  "); err != nil {
			t.Fatalf("the command pipes through jq, but the body is not JSON: %v\n%s", err, body)
		}
		if got := strings.TrimSpace(pretty.String()); got != want {
			t.Errorf("jq would print\n%s\nthe document shows\n%s", got, want)
		}
		return
	}
	if strings.HasPrefix(want, "{\n") || strings.HasPrefix(want, "[\n") {
		t.Errorf("the document shows indented JSON, which curl does not print: pipe the command through jq")
	}
	// Every JSON value of the body, so that JSON Lines are compared line
	// by line.
	wantJSON, err := decodeAll([]byte(want))
	if err != nil {
		if got := strings.TrimSpace(string(body)); got != want {
			t.Errorf("body\n%s\nthe document shows\n%s", got, want)
		}
		return
	}
	gotJSON, err := decodeAll(body)
	if err != nil || len(gotJSON) != len(wantJSON) {
		t.Errorf("body\n%s\nthe document shows\n%s", body, want)
		return
	}
	for i := range wantJSON {
		if !reflect.DeepEqual(wildcards(gotJSON[i], wantJSON[i]), wantJSON[i]) {
			t.Errorf("body\n%s\nthe document shows\n%s", body, want)
			return
		}
	}
}

func decodeAll(b []byte) ([]any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var values []any
	for {
		var v any
		if err := d.Decode(&v); err == io.EOF {
			return values, nil
		} else if err != nil {
			return nil, err
		}
		values = append(values, v)
	}
}

// piped returns the step's curl command without a trailing "| jq", and
// whether it had one.
func (s step) piped() (string, bool) {
	command, found := strings.CutSuffix(strings.TrimSpace(s.command), "| jq")
	return strings.TrimSpace(command), found
}

func decode(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	return d.Decode(v)
}

// shellWords splits a command line as a POSIX shell would, for the
// quoting the README uses: single quotes, double quotes, backslashes.
func shellWords(t *testing.T, s string) []string {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '$' && i+1 < len(s) && s[i+1] == '\'':
			// $'...': bash's quoting of a JSON Lines body, whose \n is
			// a line break (the only escape the documents use).
			j := strings.IndexByte(s[i+2:], '\'')
			if j < 0 {
				t.Fatalf("unclosed quote in %q", s)
			}
			cur.WriteString(strings.ReplaceAll(s[i+2:i+2+j], `\n`, "\n"))
			i += j + 2
			inWord = true
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				t.Fatalf("unclosed quote in %q", s)
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				cur.WriteByte(s[i])
			}
			inWord = true
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}
