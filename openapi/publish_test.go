package openapi

import (
	"encoding/json"
	"testing"

	"github.com/caddy-batch/caddy-batch/policy"
)

// publish imports a document with default settings and publishes it.
func publish(t testing.TB, file string, g Gateway) (map[string]any, []byte) {
	t.Helper()
	im, err := Import(load(t, file), Options{})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := gateway(t, im)
	var served []Served
	for i, r := range p.Resources() {
		served = append(served, Served{Resource: r, DocPath: im.Resources[i].DocPath, DocItemPath: im.Resources[i].DocItemPath})
	}
	if g.Prefix == "" {
		g.Prefix = im.Prefix
	}
	raw, err := Publish(im, served, g)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	return doc, raw
}

func TestPublishDebug(t *testing.T) {
	_, raw := publish(t, "drf.yaml", Gateway{Envelope: "/api/batch"})
	t.Log(string(raw))
	if _, err := Parse("published.json", raw); err != nil {
		t.Fatal(err)
	}
	_ = policy.OpGet
}
