package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
)

// MaxCallIDLen bounds a call id, so a record key stays small.
const MaxCallIDLen = 128

const idRule = "must be 1-64 characters of a-z, 0-9 and -"

// ValidID reports whether s is a valid team or project id: 1 to 64
// characters of [a-z0-9-].
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// ValidateTeamID returns a *ValidationError for an invalid team id.
func ValidateTeamID(id string) error {
	if !ValidID(id) {
		return invalid("teamId", idRule)
	}
	return nil
}

// ValidateCallID returns a *ValidationError for a call id that is empty or
// longer than MaxCallIDLen.
func ValidateCallID(id string) error {
	if id == "" || len(id) > MaxCallIDLen {
		return invalid("id", "must be 1-%d characters", MaxCallIDLen)
	}
	return nil
}

// MaxIdempotencyKeyLen bounds an idempotency key, so an index key stays small.
const MaxIdempotencyKeyLen = 256

// ValidateIdempotencyKey returns a *ValidationError for a key that is longer
// than MaxIdempotencyKeyLen or holds a NUL (the index separates team and key
// with one).
func ValidateIdempotencyKey(key string) error {
	if len(key) > MaxIdempotencyKeyLen || strings.ContainsRune(key, 0) {
		return invalid("idempotencyKey", "must be at most %d characters without NUL", MaxIdempotencyKeyLen)
	}
	return nil
}

// IdempotencyIndexKey is the key under which a store indexes a call started
// with an idempotency key: the team, a NUL, the key. Team ids hold no NUL,
// so two teams never share one.
func IdempotencyIndexKey(teamID, key string) []byte {
	b := make([]byte, 0, len(teamID)+1+len(key))
	b = append(b, teamID...)
	b = append(b, 0)
	return append(b, key...)
}

// RequestHash is the hex SHA-256 of what makes two starts the same request
// under one idempotency key: the project and the inputs as JSON values, so
// that neither whitespace nor the order of object keys counts (a client's
// JSON encoder need not keep either), while every number keeps its text.
func RequestHash(projectID string, inputs []byte) string {
	h := sha256.New()
	h.Write([]byte(projectID))
	h.Write([]byte{0})
	h.Write(canonicalJSON(inputs))
	return hex.EncodeToString(h.Sum(nil))
}

// canonicalJSON re-encodes b with object keys sorted, or returns b as it is
// when it is not JSON.
func canonicalJSON(b []byte) []byte {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return b
	}
	out, err := json.Marshal(v) // maps encode with sorted keys
	if err != nil {
		return b
	}
	return out
}
