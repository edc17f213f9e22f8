// Command imagemodel is a model server with no dependencies, built static
// (CGO_ENABLED=0) so that it can be an image's only file: the example of a
// model shipped as an OCI image (docs/images.md), and what the tests run
// in one. It speaks the http protocol: GET /healthz answers 200, and
// POST / answers what the model sees of its world:
//
//	{"root": [the names in /], "cwd": "...", "uid": N, "env": {NAME: value},
//	 "stat": {path: "file"|"dir"|"absent"|error}, "read": "contents",
//	 "write": "ok"|error, "greeting": $GREETING}
//
// for inputs {"stat": [paths], "read": path, "write": path, "env": [names]}.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
)

type inputs struct {
	Stat  []string `json:"stat"`
	Read  string   `json:"read"`
	Write string   `json:"write"`
	Env   []string `json:"env"`
}

func main() {
	http.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"ok": true}`))
	})
	http.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		var in inputs
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(answer(in))
	})
	addr := os.Getenv("HOST") + ":" + os.Getenv("PORT")
	fmt.Println("imagemodel listening on", addr)
	if err := http.ListenAndServe(addr, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func answer(in inputs) map[string]any {
	out := map[string]any{"uid": os.Getuid(), "greeting": os.Getenv("GREETING")}
	var root []string
	if ents, err := os.ReadDir("/"); err == nil {
		for _, e := range ents {
			root = append(root, e.Name())
		}
	}
	out["root"] = root
	out["cwd"], _ = os.Getwd()
	env := map[string]string{}
	for _, k := range in.Env {
		env[k] = os.Getenv(k)
	}
	out["env"] = env
	stat := map[string]string{}
	for _, p := range in.Stat {
		fi, err := os.Stat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			stat[p] = "absent"
		case err != nil:
			stat[p] = err.Error()
		case fi.IsDir():
			stat[p] = "dir"
		default:
			stat[p] = "file"
		}
	}
	out["stat"] = stat
	if in.Read != "" {
		b, err := os.ReadFile(in.Read)
		if err != nil {
			out["read"] = err.Error()
		} else {
			out["read"] = string(b)
		}
	}
	if in.Write != "" {
		if err := os.WriteFile(in.Write, []byte("written"), 0o644); err != nil {
			out["write"] = err.Error()
		} else {
			out["write"] = "ok"
		}
	}
	return out
}
