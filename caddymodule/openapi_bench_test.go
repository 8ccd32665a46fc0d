package caddymodule

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// largeDocument writes an OpenAPI document of n/2 collections and their
// items (n paths), each with GET and POST on the collection, GET, PUT,
// PATCH and DELETE on the item, and a schema, as a 500-path API's
// generated document is.
func largeDocument(b testing.TB, n int) string {
	var doc strings.Builder
	doc.WriteString("openapi: 3.0.3\ninfo: {title: large, version: '1'}\nservers: [{url: 'http://legacy:3000/api'}]\npaths:\n")
	op := func(method, schema string, body bool) string {
		s := fmt.Sprintf("    %s:\n      operationId: %s%s\n", method, method, schema)
		if body {
			s += fmt.Sprintf("      requestBody:\n        content:\n          application/json:\n            schema: {$ref: '#/components/schemas/%s'}\n", schema)
		}
		return s + fmt.Sprintf("      responses:\n        '200':\n          description: ok\n          content:\n            application/json:\n              schema: {$ref: '#/components/schemas/%s'}\n", schema)
	}
	var schemas strings.Builder
	for i := range n / 2 {
		name := fmt.Sprintf("Thing%d", i)
		fmt.Fprintf(&doc, "  /things%d:\n", i)
		doc.WriteString(strings.Replace(op("get", name, false), "operationId: get", "operationId: list", 1))
		doc.WriteString(op("post", name, true))
		fmt.Fprintf(&doc, "  /things%d/{thing_id}:\n    parameters:\n      - {name: thing_id, in: path, required: true, schema: {type: integer}}\n", i)
		for _, m := range []string{"get", "put", "patch", "delete"} {
			doc.WriteString(op(m, name, m == "put" || m == "patch"))
		}
		fmt.Fprintf(&schemas, "    %s:\n      type: object\n      properties:\n        id: {type: integer}\n        name: {type: string}\n        total: {type: number}\n", name)
	}
	doc.WriteString("components:\n  schemas:\n" + schemas.String())
	file := filepath.Join(b.(interface{ TempDir() string }).TempDir(), "large.yaml")
	if err := os.WriteFile(file, []byte(doc.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	return file
}

// provisionOpenAPI is what Provision does with the document: read and
// import it, resolve the resources and build the map, and build the
// published document.
func provisionOpenAPI(b *testing.B, h *Handler) *publishedDoc {
	cfg, err := h.resolve(nil, true)
	if err != nil {
		b.Fatal(err)
	}
	return cfg.published
}

// BenchmarkProvisionOpenAPI measures the provisioning of a 500-path
// document (250 resources), and of the same 250 resources declared
// without one: time and allocations per provision, the published
// document's size, and the heap a provisioned handler keeps.
//
//	go test -run '^$' -bench ProvisionOpenAPI -benchmem ./caddymodule
func BenchmarkProvisionOpenAPI(b *testing.B) {
	file := largeDocument(b, 500)
	b.Run("openapi-500-paths", func(b *testing.B) {
		var doc *publishedDoc
		cpu := processCPU(b)
		for b.Loop() {
			doc = provisionOpenAPI(b, &Handler{OpenAPI: &OpenAPIConfig{File: file, Publish: "/api/openapi.json"}})
		}
		b.ReportMetric(float64((processCPU(b)-cpu).Milliseconds())/float64(b.N), "cpu-ms/op")
		b.ReportMetric(float64(len(doc.body)), "published-B")
		b.ReportMetric(retained(b, func() any {
			h := &Handler{OpenAPI: &OpenAPIConfig{File: file, Publish: "/api/openapi.json"}}
			h.published = provisionOpenAPI(b, h)
			return h
		}), "retained-B")
	})
	b.Run("declared-250-resources", func(b *testing.B) {
		declared := func() *Handler {
			h := &Handler{}
			for i := range 250 {
				h.Resources = append(h.Resources, Resource{Path: fmt.Sprintf("/api/things%d", i),
					Collection: []string{"GET", "POST", "PATCH", "DELETE"}, Item: []string{"GET", "PUT", "PATCH", "DELETE"}})
			}
			return h
		}
		cpu := processCPU(b)
		for b.Loop() {
			if _, err := declared().resolve(nil, true); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64((processCPU(b)-cpu).Milliseconds())/float64(b.N), "cpu-ms/op")
		b.ReportMetric(retained(b, func() any {
			h := declared()
			h.config, _ = h.resolve(nil, true)
			return h
		}), "retained-B")
	})
}

// retained is the heap that what build returns keeps alive.
func retained(b *testing.B, build func() any) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	kept := build()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(kept)
	return float64(after.HeapAlloc) - float64(before.HeapAlloc)
}

// processCPU is the CPU time this process has used so far.
func processCPU(b testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
