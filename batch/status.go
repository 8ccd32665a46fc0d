package batch

import "net/http"

// What an answer's status and headers say, as every step of the saga
// reads them.

func is2xx(status int) bool { return status >= 200 && status < 300 }

// retryable reports whether a failed request may succeed if sent again.
func retryable(status int) bool {
	return status >= 500 || status == http.StatusRequestTimeout || status == http.StatusTooManyRequests
}

func gone(status int) bool { return status == http.StatusNotFound || status == http.StatusGone }

func statusOf(resp *SubResponse) int {
	if resp == nil {
		return 0
	}
	return resp.Status
}

// strongETag returns the answer's ETag if it is strong: only a strong
// validator proves that a representation is byte for byte the same.
func strongETag(h http.Header) string {
	etag := h.Get("ETag")
	if len(etag) < 2 || etag[0] != '"' || etag[len(etag)-1] != '"' {
		return ""
	}
	return etag
}
