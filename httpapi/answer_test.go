package httpapi

import (
	"encoding/json"
	"reflect"
	"testing"

	"inferd/store"
)

// filledResponse is an inferenceResponse with every exported field set from
// seed, by reflection, so that a field added to it is filled (and
// appendJSON found to leave it out) without this test knowing of it.
func filledResponse(t *testing.T, seed string, n int64) inferenceResponse {
	t.Helper()
	var r inferenceResponse
	v := reflect.ValueOf(&r).Elem()
	for i := range v.NumField() {
		f, sf := v.Field(i), v.Type().Field(i)
		if !sf.IsExported() {
			continue
		}
		switch {
		case f.Kind() == reflect.String:
			f.SetString(seed + sf.Name)
		case f.Kind() == reflect.Int64:
			f.SetInt(n)
		case f.Kind() == reflect.Bool:
			f.SetBool(true)
		case f.Type() == reflect.TypeFor[*int]():
			m := int(n)
			f.Set(reflect.ValueOf(&m))
		case f.Type() == reflect.TypeFor[*int64]():
			m := n
			f.Set(reflect.ValueOf(&m))
		case f.Type() == reflect.TypeFor[*[2]int64]():
			f.Set(reflect.ValueOf(&[2]int64{n - 1, n + 1}))
		case f.Type() == reflect.TypeFor[*store.Wait]():
			f.Set(reflect.ValueOf(&store.Wait{Code: seed, Text: sf.Name}))
		default:
			t.Fatalf("filledResponse does not know how to fill %s (%s): teach it, and appendJSON", sf.Name, f.Type())
		}
	}
	return r
}

// Every start and check answer is what json.Marshal made of it: every
// field set, none set, odd strings.
func TestResponseEncodesAsJSONMarshal(t *testing.T) {
	for _, r := range []inferenceResponse{{}, filledResponse(t, "x", 42), filledResponse(t, "<é\"\\\n\xff\u2028>", -7)} {
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.appendJSON(nil); string(got) != string(want) {
			t.Errorf("appendJSON =\n%s\njson.Marshal =\n%s", got, want)
		}
	}
}
