package store

import (
	"encoding/json"
	"math"
	"reflect"
	"testing"
	"time"
)

// filledCall is a Call with every field set from seed, by reflection, down
// into the structs it points to (its tokens, its usage), so that a field
// added to Call is filled (and AppendRecord found to leave it out) without
// this test knowing of it.
func filledCall(t *testing.T, seed string, n int64, when time.Time) Call {
	t.Helper()
	var c Call
	fill(t, reflect.ValueOf(&c).Elem(), seed, n, when)
	return c
}

func fill(t *testing.T, v reflect.Value, seed string, n int64, when time.Time) {
	t.Helper()
	for i := range v.NumField() {
		f, name := v.Field(i), v.Type().Field(i).Name
		switch {
		case name == "Inputs" || name == "Outputs" || v.Type().Field(i).Tag.Get("json") == "-": // never written
		case f.Kind() == reflect.String:
			f.SetString(seed + name)
		case f.Kind() == reflect.Int || f.Kind() == reflect.Int64:
			f.SetInt(n)
		case f.Kind() == reflect.Float64:
			f.SetFloat(float64(n) / 7)
		case f.Kind() == reflect.Bool:
			f.SetBool(true)
		case f.Type() == reflect.TypeFor[time.Time]():
			f.Set(reflect.ValueOf(when))
		case f.Type() == reflect.TypeFor[[]string]():
			f.Set(reflect.ValueOf([]string{seed, name}))
		case f.Type() == reflect.TypeFor[*float64]():
			x := float64(n) * 1e-7 // exponent form when n is small
			f.Set(reflect.ValueOf(&x))
		case f.Type() == reflect.TypeFor[*int64]():
			f.Set(reflect.ValueOf(&n))
		case f.Kind() == reflect.Pointer && f.Type().Elem().Kind() == reflect.Struct:
			f.Set(reflect.New(f.Type().Elem()))
			fill(t, f.Elem(), seed, n, when)
		default:
			t.Fatalf("filledCall does not know how to fill %s.%s (%s): teach it, and AppendRecord", v.Type(), name, f.Type())
		}
	}
}

func sameRecord(t *testing.T, c Call) {
	t.Helper()
	want, wantErr := json.Marshal(c)
	got, err := AppendRecord([]byte("prefix"), c)
	if (err == nil) != (wantErr == nil) {
		t.Fatalf("AppendRecord(%+v) error %v, json.Marshal's %v", c, err, wantErr)
	}
	if err == nil && string(got) != "prefix"+string(want) {
		t.Errorf("AppendRecord =\n%s\njson.Marshal =\n%s", got[len("prefix"):], want)
	}
}

// A call's record is what json.Marshal makes of the call (less its
// payloads): every field set, none set, odd strings and every kind of time.
func TestAppendRecordIsJSONMarshal(t *testing.T) {
	when := time.Date(2026, 11, 27, 7, 0, 0, 123456789, time.UTC)
	sameRecord(t, Call{})
	sameRecord(t, filledCall(t, "x", 42, when))
	sameRecord(t, filledCall(t, "<é\"\\\n\xff\u2028>", -7, when.In(time.FixedZone("", -3*3600))))
	sameRecord(t, filledCall(t, "", 0, time.Time{}))
	sameRecord(t, filledCall(t, "y", 1, time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC))) // json.Marshal refuses it
	for _, u := range []CallUsage{{}, {ReplicaSeconds: 1e21, GPUSeconds: 2.5e-9}, {ReplicaSeconds: math.NaN()}, {GPUSeconds: math.Inf(1)}} {
		c := filledCall(t, "u", 3, when)
		c.Usage = &u
		sameRecord(t, c) // NaN and the infinities: json.Marshal's error
	}
}

func FuzzAppendRecord(f *testing.F) {
	f.Add("call_1", int64(3), int64(1700000000), false)
	f.Fuzz(func(t *testing.T, s string, n, unix int64, empty bool) {
		c := filledCall(t, s, n, time.Unix(unix, n).UTC())
		if empty {
			c.WebhookEvents, c.Streamed = nil, false
		}
		sameRecord(t, c)
	})
}
