package telemetry

import (
	"go.uber.org/zap"

	"github.com/caddy-batch/caddy-batch/batch"
)

// OutcomeFields are what a log line says of how a batch ended, beyond its
// outcome: why it failed, what it left behind, and the sub-requests'
// underlying errors. The items left behind are named with why; their
// pre-images, personal data as likely as not, are in the kept saga
// (named, with the command that shows it) when the batch keeps a
// journal, and only without one in the line itself: there is nowhere
// else to keep them (docs/operations.md, "The log line").
func OutcomeFields(res *batch.Result, saga string) []zap.Field {
	var fields []zap.Field
	if res.Detail != "" {
		fields = append(fields, zap.String("detail", res.Detail))
	}
	if len(res.LeftBehind) > 0 {
		fields = append(fields, zap.Strings("left_behind", res.LeftBehind))
		if saga != "" {
			fields = append(fields, zap.String("show", "caddy batch saga "+saga))
		}
	}
	if len(res.Preimages) > 0 && saga == "" {
		fields = append(fields, zap.Any("preimages", res.Preimages))
	}
	if len(res.Errors) > 0 {
		fields = append(fields, zap.Strings("errors", res.Errors))
	}
	return fields
}
