package jsonw

import (
	"encoding/json"
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
