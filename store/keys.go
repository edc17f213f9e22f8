package store

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"slices"
	"time"
)

// API key secrets look like "ik_<id>_<secret>": id is keyIDLen lowercase hex
// characters, random and not secret (it finds the stored key and may be
// logged); secret is 32 random bytes, base64url without padding. Only the
// SHA-256 of the whole string is stored.
const (
	keyPrefix      = "ik_"
	keyIDLen       = 10
	keySecretBytes = 32
	maxSecretLen   = 128 // longer input is malformed without hashing it
)

// NewKey validates a key request and draws a fresh key for it: the secret,
// shown once, and the record to store (its Hash, never the secret). An empty
// scope means ScopeTeam; lim narrows a team key (see KeyLimits). Key ids are
// 40 random bits: a store that finds the id taken draws again.
func NewKey(teamID string, scope KeyScope, lim KeyLimits, now time.Time) (secret string, k APIKey, err error) {
	if err := ValidateTeamID(teamID); err != nil {
		return "", APIKey{}, err
	}
	switch scope {
	case "":
		scope = ScopeTeam
	case ScopeTeam, ScopeAdmin:
	default:
		return "", APIKey{}, invalid("scope", "must be %q or %q", ScopeTeam, ScopeAdmin)
	}
	if err := lim.validate(scope); err != nil {
		return "", APIKey{}, err
	}
	lim.Permissions = slices.Clone(lim.Permissions)
	lim.Projects = slices.Clone(lim.Projects)
	if !lim.Expires.IsZero() {
		lim.Expires = lim.Expires.UTC()
	}
	var idb [keyIDLen / 2]byte
	var sec [keySecretBytes]byte
	_, _ = rand.Read(idb[:]) // crypto/rand.Read never fails
	_, _ = rand.Read(sec[:])
	id := hex.EncodeToString(idb[:])
	secret = keyPrefix + id + "_" + base64.RawURLEncoding.EncodeToString(sec[:])
	k = APIKey{ID: id, TeamID: teamID, Scope: scope, Hash: HashKeySecret(secret), Created: now.UTC(), KeyLimits: lim}
	return secret, k, nil
}

// HashKeySecret returns the hex SHA-256 of an API key secret, the form kept
// in APIKey.Hash.
func HashKeySecret(secret string) string { return hashHex(secret) }

// HashModelKey returns the hex SHA-256 of a modelKey, the form stored in
// ModelSpec.KeyHash and looked up by ProjectByModelKey.
func HashModelKey(modelKey string) string { return hashHex(modelKey) }

func hashHex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// KeyIDOf returns the key id embedded in an API key secret, or false if the
// secret is not shaped like one: such a secret is invalid without a lookup.
func KeyIDOf(secret string) (string, bool) {
	if len(secret) > maxSecretLen || len(secret) < len(keyPrefix)+keyIDLen+2 ||
		secret[:len(keyPrefix)] != keyPrefix || secret[len(keyPrefix)+keyIDLen] != '_' {
		return "", false
	}
	id := secret[len(keyPrefix) : len(keyPrefix)+keyIDLen]
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return "", false
		}
	}
	for _, c := range []byte(secret[len(keyPrefix)+keyIDLen+1:]) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return "", false
		}
	}
	return id, true
}

// Matches reports, in constant time, whether secret is this key's secret.
// It does not look at revocation.
func (k APIKey) Matches(secret string) bool {
	var want [sha256.Size]byte
	if n, err := hex.Decode(want[:], []byte(k.Hash)); err != nil || n != sha256.Size {
		return false
	}
	sum := sha256.Sum256([]byte(secret))
	return subtle.ConstantTimeCompare(sum[:], want[:]) == 1
}
