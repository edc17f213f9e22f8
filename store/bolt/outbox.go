package bolt

import (
	"encoding/binary"
	"encoding/json"
	"fmt"

	bbolt "go.etcd.io/bbolt"

	"inferd/store"
)

// queueDeliveries puts the deliveries that cw's call write makes due into the
// outbox, in the call write's transaction, skipping those already pending or
// ended (see schema.go), and records on cw those it queued, for the hooks
// run after the commit.
func queueDeliveries(tx *bbolt.Tx, cw *callWrite) error {
	cw.queued = cw.queued[:0]
	if len(cw.deliveries) == 0 {
		return nil
	}
	outbox := tx.Bucket(bucketOutbox)
	ended := tx.Bucket(bucketOutboxEnded)
	for i, d := range cw.deliveries {
		k := []byte(d.ID)
		if outbox.Get(k) != nil || ended.Get(k) != nil {
			continue
		}
		if err := outbox.Put(k, cw.encodedDeliveries[i]); err != nil {
			return err
		}
		cw.queued = append(cw.queued, d)
	}
	return nil
}

// encodeDeliveries encodes ds ahead of the writer's transaction.
func encodeDeliveries(ds []store.Delivery) ([][]byte, error) {
	out := make([][]byte, len(ds))
	for i, d := range ds {
		v, err := json.Marshal(d)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// PendingDeliveries returns every delivery not ended, by ID.
func (s *Store) PendingDeliveries() ([]store.Delivery, error) {
	s.pend.flush() // deliveries queued by writes still only in the log
	var ds []store.Delivery
	err := s.view(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketOutbox)
		if b == nil {
			return nil // a read-only file of an older inferd
		}
		return b.ForEach(func(k, v []byte) error {
			var d store.Delivery
			if err := json.Unmarshal(v, &d); err != nil {
				return fmt.Errorf("decode delivery %s: %w", k, err)
			}
			ds = append(ds, d)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("pending deliveries: %w", err)
	}
	return ds, nil
}

// UpdateDelivery records an attempt on a pending delivery, or its end.
func (s *Store) UpdateDelivery(d store.Delivery) error {
	v, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("update delivery %s: encode: %w", d.ID, err)
	}
	err = s.update(func(tx *bbolt.Tx) error {
		outbox := tx.Bucket(bucketOutbox)
		k := []byte(d.ID)
		if outbox.Get(k) == nil {
			return store.ErrNotFound
		}
		if d.Ended.IsZero() {
			return outbox.Put(k, v)
		}
		if err := outbox.Delete(k); err != nil {
			return err
		}
		return tx.Bucket(bucketOutboxEnded).Put(k, nanosKey(d.Ended))
	})
	if err != nil {
		return fmt.Errorf("update delivery %s: %w", d.ID, err)
	}
	return nil
}

// OnDeliveryQueued registers fn for each delivery a call write queues.
func (s *Store) OnDeliveryQueued(fn func(store.Delivery)) { s.deliveryHooks.OnDeliveryQueued(fn) }

// expireEnded drops the ended deliveries that ended before limit (unix
// nanos): their calls are expired or about to be, so none can be re-saved.
func expireEnded(tx *bbolt.Tx, limit uint64) error {
	b := tx.Bucket(bucketOutboxEnded)
	var keys [][]byte
	err := b.ForEach(func(k, v []byte) error {
		if len(v) == 8 && binary.BigEndian.Uint64(v) < limit {
			keys = append(keys, append([]byte(nil), k...))
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// WebhookSecret returns the team's webhook signing secret, drawing one if
// it has none or rotate is set.
func (s *Store) WebhookSecret(teamID string, rotate bool) (string, error) {
	if err := store.ValidateTeamID(teamID); err != nil {
		return "", err
	}
	var secret string
	if !rotate {
		var err error
		if secret, err = s.TeamSecret(teamID); err != nil || secret != "" {
			return secret, err
		}
	}
	err := s.update(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketTeams).Get([]byte(teamID)) == nil {
			return store.ErrNotFound
		}
		b := tx.Bucket(bucketTeamSecrets)
		if old := b.Get([]byte(teamID)); old != nil && !rotate {
			secret = string(old) // drawn meanwhile by another caller
			return nil
		}
		secret = store.NewWebhookSecret()
		return b.Put([]byte(teamID), []byte(secret))
	})
	if err != nil {
		return "", fmt.Errorf("webhook secret of team %s: %w", teamID, err)
	}
	return secret, nil
}
