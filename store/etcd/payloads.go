package etcd

import (
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
// themselves are not read.
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
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(s.key("calls", id)), clientv3.OpGet(s.key("outputs", id)), third,
		clientv3.OpGet(s.key("payloads", id, KindOutputs)), clientv3.OpGet(s.key("payloads", id, KindInputs))).Commit()
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
	if c.Outputs, err = s.resolve(what, id, KindOutputs, payload(resp.Responses[1]), resp.Responses[3]); err != nil {
		return store.Call{}, err
	}
	if !inputs {
		c.InputBytes, err = inputSize(what, resp.Responses[2])
	} else {
		c.Inputs, err = s.resolve(what, id, KindInputs, payload(resp.Responses[2]), resp.Responses[4])
	}
	if err != nil {
		return store.Call{}, err
	}
	return c, nil
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
	resp, err := s.cli.Txn(ctx).Then(
		clientv3.OpGet(s.key("calls", id), clientv3.WithCountOnly()),
		clientv3.OpGet(s.key("inputs", id)),
		clientv3.OpGet(s.key("payloads", id, KindInputs))).Commit()
	cancel()
	if err != nil {
		return nil, s.wrap(what, err)
	}
	if resp.Responses[0].GetResponseRange().Count == 0 {
		return nil, fmt.Errorf("%s: %w", what, store.ErrNotFound)
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
