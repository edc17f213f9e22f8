package bolt

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"inferd/store"
)

// A write that carries no usage row of its own (one decoded from its
// record, as a replayed log would be) adds what its record holds.
func TestRecordUsageReadsWhatTheCallHolds(t *testing.T) {
	cpu := 1.5
	c := store.Call{ID: newCallID(), TeamID: "acme", ProjectID: "p", State: store.CallFailed,
		Finished: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), QueueMs: 100, RunMs: 2000,
		Inputs: json.RawMessage(`{"usage": "not this one"}`),
		Usage:  &store.CallUsage{ReplicaSeconds: 2, CPUSeconds: &cpu, BytesIn: 25}}
	rec, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := recordUsage(rec)
	want, _ := store.CallUsageRow(c)
	if !ok || !reflect.DeepEqual(got, want) {
		t.Errorf("recordUsage = %+v, %v; want %+v", got, ok, want)
	}
	c.Usage = nil
	rec, _ = json.Marshal(c)
	if _, ok := recordUsage(rec); ok {
		t.Error("a record without usage (its inputs say \"usage\") added some")
	}
}
