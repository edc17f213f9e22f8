package jsonw

import (
	"encoding/json"
	"math"
	"testing"
	"time"
)

var stringSeeds = []string{"", "plain", `quote " and \ back`, "<script>&</script>", "tab\tnl\nret\r\b\f\x00\x1f\x7f",
	"é ü 日本", "\u2028\u2029", "bad \xff\xfe utf8 \xc3", "\xed\xa0\x80 surrogate", "emoji 😀"}

func TestStringIsJSONMarshals(t *testing.T) {
	for _, s := range stringSeeds {
		sameString(t, s)
	}
}

func FuzzString(f *testing.F) {
	for _, s := range stringSeeds {
		f.Add(s)
	}
	f.Fuzz(sameString)
}

func sameString(t *testing.T, s string) {
	want, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if got := String(nil, s); string(got) != string(want) {
		t.Errorf("String(%q) = %s, json.Marshal: %s", s, got, want)
	}
}

func TestTimeIsJSONMarshals(t *testing.T) {
	for _, tm := range []time.Time{
		{}, time.Unix(1700000000, 123456789).UTC(), time.Unix(1700000000, 0).UTC(),
		time.Unix(1700000000, 5000).In(time.FixedZone("x", 5*3600+30*60)),
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("far", 24*3600)),
	} {
		want, err := json.Marshal(tm)
		got, ok := Time(nil, tm)
		switch {
		case err != nil && ok:
			t.Errorf("Time(%v) = %s, json.Marshal refuses it: %v", tm, got, err)
		case err == nil && (!ok || string(got) != string(want)):
			t.Errorf("Time(%v) = %s, %v; json.Marshal: %s", tm, got, ok, want)
		}
	}
}

var floatSeeds = []float64{0, 1, -1, 0.1, 1.0 / 3, 123456789, 1e20, 1e21, -1e21, 1e-6, 9.99e-7, 1e-9, 5e-324,
	math.MaxFloat64, math.Copysign(0, -1), math.NaN(), math.Inf(1), math.Inf(-1)}

func TestFloatIsJSONMarshals(t *testing.T) {
	for _, f := range floatSeeds {
		sameFloat(t, f)
	}
}

func FuzzFloat(f *testing.F) {
	for _, x := range floatSeeds {
		f.Add(x)
	}
	f.Fuzz(sameFloat)
}

func sameFloat(t *testing.T, f float64) {
	want, err := json.Marshal(f)
	got, ok := Float([]byte("x"), f)
	switch {
	case err != nil && (ok || string(got) != "x"):
		t.Errorf("Float(%v) = %s, %v; json.Marshal refuses it: %v", f, got, ok, err)
	case err == nil && (!ok || string(got) != "x"+string(want)):
		t.Errorf("Float(%v) = %s, %v; json.Marshal: %s", f, got, ok, want)
	}
}
