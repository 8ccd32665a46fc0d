package legacyapi

// Bearer tokens that expire (Collection.BearerTokens): an API whose
// client's token stops being accepted in the middle of its work, and a
// new one is.

import (
	"net/http"
	"strings"
)

// checkBearer answers a request to c that carries no bearer token the
// API accepts: 401, nothing applied. Callers hold mu.
func (a *API) checkBearer(c *collection, r *http.Request) (response, bool) {
	if len(c.BearerTokens) == 0 {
		return response{}, false
	}
	a.seedTokens()
	scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if strings.EqualFold(scheme, "Bearer") && a.tokens[token] {
		return response{}, false
	}
	res := jsonAnswer(http.StatusUnauthorized, map[string]string{"error": "invalid_token", "error_description": "The access token expired or is not known."})
	res.header.Set("WWW-Authenticate", `Bearer realm="legacy", error="invalid_token"`)
	return res, true
}

// RevokeToken makes the API refuse token from now on, as an access token
// that expired.
func (a *API) RevokeToken(token string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seedTokens()
	a.tokens[token] = false
}

// AcceptToken makes the API accept token from now on, as a token its
// client refreshed.
func (a *API) AcceptToken(token string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seedTokens()
	a.tokens[token] = true
}

// seedTokens fills the tokens the collections accept from the start,
// once. Callers hold mu.
func (a *API) seedTokens() {
	if a.tokens != nil {
		return
	}
	a.tokens = map[string]bool{}
	for _, c := range a.cols {
		for _, t := range c.BearerTokens {
			a.tokens[t] = true
		}
	}
	for _, c := range a.patterns {
		for _, t := range c.BearerTokens {
			a.tokens[t] = true
		}
	}
}
