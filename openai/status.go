package openai

import "net/http"

// StatusError is an error body with the HTTP status it goes with and the
// seconds of its Retry-After (0: none).
type StatusError struct {
	Status     int
	Body       ErrorBody
	RetryAfter int
}

// TypeOfStatus is the OpenAI error type of a status code.
func TypeOfStatus(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return TypeAuthentication
	case status == http.StatusForbidden:
		return TypePermission
	case status == http.StatusTooManyRequests:
		return TypeRateLimit
	case status == http.StatusServiceUnavailable:
		return TypeUnavailable
	case status == http.StatusGatewayTimeout:
		return TypeTimeout
	case status >= 500:
		return TypeServer
	default:
		return TypeInvalidRequest
	}
}
