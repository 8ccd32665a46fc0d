package caddymodule

import (
	"errors"
	"fmt"
	"slices"

	"github.com/caddy-batch/caddy-batch/batch"
	"github.com/caddy-batch/caddy-batch/internal/options"
	"github.com/caddy-batch/caddy-batch/openapi"
	"github.com/caddy-batch/caddy-batch/policy"
)

// config is the handler's configuration resolved: all that provisioning
// builds on.
type config struct {
	policy *policy.Policy
	// handler is the handler's own settings, over the defaults: the
	// envelope's, and the size of the max_in_flight slots.
	handler options.Level
	// envelope is nil when the handler has none.
	envelope *batch.Envelope
	// jobsPath is the handler's jobs path, without a trailing slash; ""
	// when it runs no jobs.
	jobsPath string
	// published is the OpenAPI document the handler serves, nil when it
	// publishes none.
	published *publishedDoc
	// resources are the resources served, in the policy's order:
	// declared, imported from the OpenAPI document, or both.
	resources []resolved
	// gaps are the batch operations the import left off, which
	// Provision warns of.
	gaps []openapi.Gap
}

// resolve works the handler's configuration out: every resource's
// settings (defaults, then the handler's options, then the resource's),
// the method map and the envelope. It is the one validation of a
// configuration: Provision runs it, and so does the Caddyfile adapter,
// which turns its errors' places into lines. lines, when not nil, holds
// the line each resource is declared on. The OpenAPI document, when the
// handler imports one, is read here; the one it publishes is built only
// with publish (the adapter checks where it goes, not what it holds).
func (h *Handler) resolve(lines []int, publish bool) (config, error) {
	handler := options.Defaults()
	err := h.Options.Apply(&handler)
	if err == nil {
		err = policy.Validate(handler.Settings, handler.GatewaySettings)
	}
	if err != nil {
		// Every resource inherits these, so one error each is enough.
		return config{}, err
	}
	imported, err := h.loadOpenAPI()
	if err != nil {
		return config{}, err
	}
	resources := h.resolveResources(imported)
	p, gaps, err := h.buildPolicy(handler, resources, lines)
	if err != nil {
		return config{}, err
	}
	envelope, err := h.envelopeOf(p, handler)
	if err != nil {
		return config{}, err
	}
	jobsPath, err := h.jobsPathOf(p, envelope)
	if err != nil {
		return config{}, err
	}
	published, err := h.publishOf(p, resources, imported, publish)
	if err != nil {
		return config{}, err
	}
	return config{policy: p, handler: handler, envelope: envelope, jobsPath: jobsPath, published: published, resources: resources, gaps: gaps}, nil
}

// buildPolicy lays each resource's options over the handler's settings
// and builds the method map, refusing every mistake at once; gaps are
// the batch operations the OpenAPI import left off.
func (h *Handler) buildPolicy(handler options.Level, resources []resolved, lines []int) (_ *policy.Policy, gaps []openapi.Gap, _ error) {
	var errs []error
	specs := make([]policy.ResourceSpec, len(resources))
	for i, r := range resources {
		own := handler
		if err := r.Options.Apply(&own); err != nil {
			errs = append(errs, policy.Flatten(policy.InResource(i, r.Path, err))...)
		}
		specs[i] = r.spec(own)
		if r.MaxInFlight != 0 || r.MaxInFlightAuto != nil {
			errs = append(errs, policy.InResource(i, r.Path, policy.OptionError("max_in_flight",
				errors.New("max_in_flight bounds the sub-requests of every batch of the handler together, so a resource cannot have its own: set it in the batch block"))))
		}
		for _, name := range r.handlerJobOptions() {
			errs = append(errs, policy.InResource(i, r.Path, policy.OptionError(name,
				fmt.Errorf("%s counts the jobs of every resource of the handler together, so a resource cannot have its own: set it in the batch block", name))))
		}
		if r.doc != nil {
			specs[i].Formats = r.doc.Formats
			gaps = append(gaps, openapi.Derive(&specs[i], r.keepCollection)...)
		}
		if i < len(lines) {
			specs[i].Line = lines[i]
		}
	}
	p, err := policy.New(specs)
	if len(errs) == 0 {
		return p, gaps, h.placeImported(err, resources)
	}
	// Every mistake at once, in the order the resources are declared.
	all := append(errs, policy.Flatten(err)...)
	slices.SortStableFunc(all, func(a, b error) int { return resourceOf(a) - resourceOf(b) })
	return nil, nil, h.placeImported(errors.Join(all...), resources)
}

// handlerJobOptions names the handler-only job options r sets.
func (r Resource) handlerJobOptions() []string {
	var names []string
	for _, o := range []struct {
		name string
		set  bool
	}{{"max_jobs", r.MaxJobs != 0}, {"max_jobs_per_client", r.MaxJobsPerClient != 0}, {"max_queued_jobs", r.MaxQueuedJobs != 0}} {
		if o.set {
			names = append(names, o.name)
		}
	}
	return names
}

// spec declares the resource to the policy, with its resolved settings.
func (r Resource) spec(l options.Level) policy.ResourceSpec {
	var ops []string // nil: every operation the methods allow
	if r.Batch != nil {
		ops = append([]string{}, *r.Batch...)
	}
	spec := policy.ResourceSpec{
		Path:              r.Path,
		CollectionMethods: r.Collection,
		ItemMethods:       r.Item,
		ItemPath:          r.ItemPath,
		Batch:             ops,
		Settings:          l.Settings,
		Gateway:           l.GatewaySettings,
	}
	if f := r.ListFilter; f != nil {
		spec.ListFilter = &policy.ListFilterSpec{Template: f.Query, Items: f.Items, MaxIDs: f.MaxIDs, Preflight: f.Preflight}
	}
	return spec
}

func resourceOf(err error) int {
	var pe *policy.Error
	if errors.As(err, &pe) {
		return pe.Resource
	}
	return -1
}
