package openai

import "encoding/json"

// Error types of OpenAI's error body.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeAuthentication = "authentication_error"
	TypePermission     = "permission_error"
	TypeNotFound       = "not_found_error"
	TypeRateLimit      = "rate_limit_error"
	TypeServer         = "server_error"
	TypeUnavailable    = "service_unavailable"
	TypeTimeout        = "timeout"
)

// ErrorBody is OpenAI's error shape: {"error": {"message", "type",
// "param", "code"}}, param and code null when they say nothing.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the error of an ErrorBody.
type ErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// NewError returns the body of an error; empty param or code are null.
func NewError(typ, code, param, msg string) ErrorBody {
	d := ErrorDetail{Message: msg, Type: typ}
	if param != "" {
		d.Param = &param
	}
	if code != "" {
		d.Code = &code
	}
	return ErrorBody{d}
}

// ModelError returns the error a model server answered (the body of a
// non-2xx reply) in OpenAI's shape, so that it can be passed on as the
// server said it: {"error": {...}} (OpenAI, llama.cpp, newer vLLM) or the
// bare {"object": "error", "message": ...} of older vLLM. A code or param
// that is not a string (llama.cpp's numeric code) becomes null.
func ModelError(body []byte) (ErrorBody, bool) {
	type detail struct {
		Object  string          `json:"object"`
		Message string          `json:"message"`
		Type    string          `json:"type"`
		Param   json.RawMessage `json:"param"`
		Code    json.RawMessage `json:"code"`
	}
	var e struct {
		Error *detail `json:"error"`
		detail
	}
	if json.Unmarshal(body, &e) != nil {
		return ErrorBody{}, false
	}
	d := e.Error
	if d == nil && e.Object == "error" {
		d = &e.detail
	}
	if d == nil || d.Message == "" {
		return ErrorBody{}, false
	}
	out := ErrorBody{ErrorDetail{Message: d.Message, Type: d.Type, Param: stringOrNil(d.Param), Code: stringOrNil(d.Code)}}
	if out.Error.Type == "" {
		out.Error.Type = TypeInvalidRequest
	}
	return out, true
}

func stringOrNil(raw json.RawMessage) *string {
	var s string
	if len(raw) == 0 || isNull(raw) || json.Unmarshal(raw, &s) != nil {
		return nil
	}
	return &s
}
