package protocol

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"inferd/scheduler/backend"
)

func TestCallsGoToTheirRoute(t *testing.T) {
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"path":"` + r.URL.Path + `"}`))
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	httpModel, _ := New(Config{Addr: addr, InferPath: "/predict"})
	potassium, _ := New(Config{Addr: addr, Protocol: "potassium"})
	defer httpModel.Close()
	defer potassium.Close()
	tests := []struct {
		name  string
		c     *Client
		route string
		want  string // the reply
	}{
		{"http, no route", httpModel, "", `{"path":"/predict"}`},
		{"http, root route", httpModel, "/", `{"path":"/predict"}`},
		{"http, a route under inferPath", httpModel, "/v2/embed", `{"path":"/predict/v2/embed"}`},
		{"http warmup is answered without the model", httpModel, backend.WarmupRoute, `{"warm":true}`},
		{"potassium handler route", potassium, "/second", `{"path":"/second"}`},
		{"potassium warmup goes to the app", potassium, backend.WarmupRoute, `{"path":"/_k/warmup"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := tc.c.Infer(context.Background(), backend.Request{Inputs: json.RawMessage(`{}`), Route: tc.route})
			if err != nil || string(out) != tc.want {
				t.Errorf("Infer = %s, %v; want %s", out, err, tc.want)
			}
		})
	}
	if len(paths) != 5 {
		t.Errorf("the model saw %v; the http warmup must not reach it", paths)
	}
}
