package storetest

import (
	"reflect"
	"testing"

	"inferd/store"
)

// ModelSpecFields returns the names of every field of store.ModelSpec, so a
// test that goes over them covers a field added later without being told.
func ModelSpecFields() []string {
	typ := reflect.TypeFor[store.ModelSpec]()
	names := make([]string, typ.NumField())
	for i := range names {
		names[i] = typ.Field(i).Name
	}
	return names
}

// ChangeModelSpecField returns m with the named field set to a different
// value that still passes validation: a string is extended (a path keeps its
// leading slash, the protocol flips between http and potassium, the key hash
// becomes another hash), a number grows by one, a bool flips, batching turns
// on (or takes one more call), a list gets one more
// element and a map one more entry. A field of a kind it does not know
// fails the test: teach it rather than skip the field.
func ChangeModelSpecField(t testing.TB, m store.ModelSpec, name string) store.ModelSpec {
	t.Helper()
	v := reflect.ValueOf(&m).Elem().FieldByName(name)
	if !v.IsValid() {
		t.Fatalf("store.ModelSpec has no field %s", name)
	}
	switch {
	case name == "KeyHash":
		m.KeyHash = store.HashModelKey(m.KeyHash + "-changed")
	case name == "Protocol" && m.Protocol == store.ProtocolPotassium:
		m.Protocol = store.ProtocolHTTP
	case name == "Protocol":
		m.Protocol = store.ProtocolPotassium
	case name == "Network" && m.Network == store.NetworkHost:
		m.Network = store.NetworkPrivate
	case name == "Network":
		m.Network = store.NetworkHost
	case name == "Batch" && m.Batch.On():
		m.Batch.MaxSize++
	case name == "Batch":
		m.Batch = store.BatchSpec{MaxSize: 4, MaxWaitMs: 5}
	case name == "Python":
		m.Python.Requirements += "/changed"
	case name == "MemoryMiB":
		m.MemoryMiB = max(m.MemoryMiB+1, store.MinMemoryMiB)
	case v.Kind() == reflect.String && v.String() == "":
		v.SetString("/changed")
	case v.Kind() == reflect.String:
		v.SetString(v.String() + "-changed")
	case v.Kind() == reflect.Bool:
		v.SetBool(!v.Bool())
	case v.Kind() == reflect.Int:
		v.SetInt(v.Int() + 1)
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.String:
		v.Set(reflect.Append(v, reflect.ValueOf("changed")))
	case v.Kind() == reflect.Map && v.Type().Key().Kind() == reflect.String && v.Type().Elem().Kind() == reflect.String:
		mv := reflect.MakeMap(v.Type())
		for _, k := range v.MapKeys() {
			mv.SetMapIndex(k, v.MapIndex(k))
		}
		mv.SetMapIndex(reflect.ValueOf("CHANGED"), reflect.ValueOf("1"))
		v.Set(mv)
	default:
		t.Fatalf("ChangeModelSpecField does not know how to change %s (%s): teach it", name, v.Type())
	}
	return m
}
