package store

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
