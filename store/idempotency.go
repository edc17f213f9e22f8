package store

// MaxIdempotencyKeyLen bounds an idempotency key, which is part of an
// index key.
const MaxIdempotencyKeyLen = 128

// IdempotencyIndexKey is the index key of a team's idempotency key: the
// team, a 0 byte (never in a team id), the key.
func IdempotencyIndexKey(teamID, key string) []byte {
	return []byte(teamID + "\x00" + key)
}
