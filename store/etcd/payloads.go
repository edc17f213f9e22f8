package etcd

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
)

// GetCall implements store.Calls: the record and both payloads, read in
// one transaction (one revision); a payload held on nodes is then fetched
// from them (held.go).
func (s *Store) GetCall(id string) (store.Call, error) {
	return s.readCall(fmt.Sprintf("get call %s", id), id, true)
}

// GetCallResult implements store.Calls: the record, the outputs as the
// bytes stored and the inputs' size, in one transaction; the inputs
// themselves are not read (but for a final record's small ones, in it).
func (s *Store) GetCallResult(id string) (store.Call, error) {
	return s.readCall(fmt.Sprintf("get call result %s", id), id, false)
}

// readCall reads call id's record and outputs at one revision, with its
// inputs when inputs is set, or else their size; a missing record is
// store.ErrNotFound.
func (s *Store) readCall(what, id string, inputs bool) (store.Call, error) {
	if err := s.check(what); err != nil {
		return store.Call{}, err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	third := clientv3.OpGet(s.key("inputsize", id))
	if inputs {
		third = clientv3.OpGet(s.key("inputs", id))
	}
	resp, _, err := s.commitTxn(ctx, func(ctx context.Context) clientv3.Txn {
		return s.cli.Txn(ctx).Then(clientv3.OpGet(s.key("calls", id)), clientv3.OpGet(s.key("outputs", id)), third,
			clientv3.OpGet(s.key("payloads", id, KindOutputs)), clientv3.OpGet(s.key("payloads", id, KindInputs)))
	})
	cancel() // a payload held on nodes is fetched within its own bound
	if err != nil {
		return store.Call{}, s.wrap(what, err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return store.Call{}, fmt.Errorf("%s: %w", what, store.ErrNotFound)
	}
	c, err := decode[store.Call](what, string(kvs[0].Key), kvs[0].Value)
	if err != nil {
		return store.Call{}, err
	}
	// A payload in the record (a final write's small one: callOps) is the
	// call's; the keys hold those of records without.
	if c.Outputs == nil {
		if c.Outputs, err = s.resolve(what, id, KindOutputs, payload(resp.Responses[1]), resp.Responses[3]); err != nil {
			return store.Call{}, err
		}
	}
	switch {
	case !inputs:
		err = withoutInputs(what, &c, resp.Responses[2])
	case c.Inputs == nil:
		c.Inputs, err = s.resolve(what, id, KindInputs, payload(resp.Responses[2]), resp.Responses[4])
	}
	if err != nil {
		return store.Call{}, err
	}
	return c, nil
}

// recordInputs is what a call record says of its inputs: those a final
// write kept in it (callOps), nil when it kept none.
type recordInputs struct {
	Inputs json.RawMessage `json:"inputs"`
}

// withoutInputs leaves the inputs out of c, decoded from its record, and
// sets InputBytes: their size when the record held them, or else the size
// read from inputsize/<id> (size, that key's get).
func withoutInputs(what string, c *store.Call, size *etcdserverpb.ResponseOp) error {
	if c.Inputs != nil {
		c.Inputs, c.InputBytes = nil, int64(len(c.Inputs))
		return nil
	}
	n, err := inputSize(what, size)
	c.InputBytes = n
	return err
}

// CallInputs implements store.Calls: the inputs as the bytes stored, read
// with the record's existence at one revision.
func (s *Store) CallInputs(id string) (json.RawMessage, error) {
	what := fmt.Sprintf("call inputs %s", id)
	if err := s.check(what); err != nil {
		return nil, err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	ck := s.key("calls", id)
	resp, _, err := s.commitTxn(ctx, func(ctx context.Context) clientv3.Txn {
		return s.cli.Txn(ctx).Then(
			clientv3.OpGet(ck),
			clientv3.OpGet(s.key("inputs", id)),
			clientv3.OpGet(s.key("payloads", id, KindInputs)))
	})
	cancel()
	if err != nil {
		return nil, s.wrap(what, err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return nil, fmt.Errorf("%s: %w", what, store.ErrNotFound)
	}
	// A final record may hold them (callOps); a queued call's, read when
	// it is dispatched, never does.
	rec, err := decode[recordInputs](what, ck, kvs[0].Value)
	if err != nil {
		return nil, err
	}
	if rec.Inputs != nil {
		return rec.Inputs, nil
	}
	return s.resolve(what, id, KindInputs, payload(resp.Responses[1]), resp.Responses[2])
}

// payload returns the value a get of a payload key read, or nil when the
// key is absent (no payload). The bytes are the response's own.
func payload(r *etcdserverpb.ResponseOp) json.RawMessage {
	kvs := r.GetResponseRange().Kvs
	if len(kvs) == 0 || len(kvs[0].Value) == 0 {
		return nil
	}
	return kvs[0].Value
}

// inputSize returns the size a get of an inputsize key read, 0 when absent.
func inputSize(what string, r *etcdserverpb.ResponseOp) (int64, error) {
	kvs := r.GetResponseRange().Kvs
	if len(kvs) == 0 {
		return 0, nil
	}
	n, err := strconv.ParseInt(string(kvs[0].Value), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: input size %q of %s does not parse: %w", what, kvs[0].Value, kvs[0].Key, err)
	}
	return n, nil
}
