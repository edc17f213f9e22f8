package store

import "testing"

func TestRequestHashIgnoresLayoutNotValues(t *testing.T) {
	base := RequestHash("p", []byte(`{"a":1,"b":[1,2]}`))
	tests := []struct {
		name      string
		project   string
		inputs    string
		wantEqual bool
	}{
		{"same", "p", `{"a":1,"b":[1,2]}`, true},
		{"whitespace", "p", "{ \"a\": 1,\n \"b\": [1, 2] }", true},
		{"key order", "p", `{"b":[1,2],"a":1}`, true},
		{"other value", "p", `{"a":2,"b":[1,2]}`, false},
		{"number text", "p", `{"a":1.0,"b":[1,2]}`, false},
		{"array order", "p", `{"a":1,"b":[2,1]}`, false},
		{"other project", "q", `{"a":1,"b":[1,2]}`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := RequestHash(tc.project, []byte(tc.inputs)) == base; got != tc.wantEqual {
				t.Errorf("same hash = %v, want %v", got, tc.wantEqual)
			}
		})
	}
}
