package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/rs/zerolog"

	"inferd/config"
	"inferd/httpapi/admin"
	"inferd/scheduler/backend/local"
	"inferd/store/bolt"
)

// adminClient reaches the admin API: over the running daemon's unix socket, or,
// when no daemon runs, in-process on the data file opened directly. Both paths
// run the same handler, so the CLI behaves the same either way.
type adminClient struct {
	http      *http.Client
	close     func() error
	inProcess bool // no daemon runs: the handler runs here, on the data file
}

func dialAdmin(cfg config.Config) (*adminClient, error) {
	sock := cfg.SocketPath()
	if daemonAnswers(cfg) {
		tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}
		return &adminClient{http: &http.Client{Transport: tr}, close: func() error { tr.CloseIdleConnections(); return nil }}, nil
	}
	return openAdmin(cfg)
}

// openAdmin is the admin API in-process on the data file, which it opens
// (and so locks: a daemon that holds the file makes it fail).
func openAdmin(cfg config.Config) (*adminClient, error) {
	sock := cfg.SocketPath()
	if cfg.Cluster != nil {
		// The records are in etcd, not in a data file: opening one here
		// would create an empty file no daemon reads.
		return nil, fmt.Errorf("no daemon answers on %s: in cluster mode the admin commands need this node's daemon running (inferd serve)", sock)
	}
	if err := cfg.EnsureDataDir(); err != nil {
		return nil, err
	}
	st, err := bolt.Open(cfg.StorePath(), bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("no daemon answers on %s, and the data file cannot be opened: %w", sock, err)
	}
	mc := newMachineCheck(cfg)
	h := admin.New(st, zerolog.Nop(), admin.WithLogs(local.LogDir(cfg.LogDir())),
		admin.WithModelCheck(mc.Problems), admin.WithCapacityCheck(mc.CapacityWarnings), admin.WithCancel(admin.CancelStored(st)))
	closeAll := func() error { mc.close(); return st.Close() }
	return &adminClient{http: &http.Client{Transport: handlerTransport{h}}, close: closeAll, inProcess: true}, nil
}

// daemonAnswers reports whether a daemon answers on the admin socket.
func daemonAnswers(cfg config.Config) bool {
	conn, err := net.DialTimeout("unix", cfg.SocketPath(), time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// handlerTransport serves requests with an in-process handler.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, req)
	return rec.Result(), nil
}

// withAdmin runs fn with an admin client for the data directory the global
// flags name (see dataConfig), and closes it afterwards.
func (e *env) withAdmin(fn func(*adminClient) error) error {
	cfg, err := e.dataConfig()
	if err != nil {
		return err
	}
	c, err := dialAdmin(cfg)
	if err != nil {
		return err
	}
	defer c.close()
	return fn(c)
}

// call sends a JSON request to the admin API and decodes the JSON reply into out.
func (c *adminClient) call(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	resp, err := c.do(ctx, method, path, rd)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("admin API: read reply: %w", err)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("admin API: decode reply: %w", err)
	}
	return nil
}

// stream sends a GET to the admin API and copies the reply body to w as it
// arrives. It returns the reply's headers and the bytes copied; an error
// reply, or a body cut short, is an error.
func (c *adminClient) stream(ctx context.Context, path string, w io.Writer) (http.Header, int64, error) {
	resp, err := c.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return resp.Header, n, fmt.Errorf("admin API: read reply: %w", err)
	}
	return resp.Header, n, nil
}

// do sends a request to the admin API; a reply other than 2xx becomes an
// error carrying the API's own message.
func (c *adminClient) do(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://inferd"+path, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("admin API: %w", err)
	}
	if resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	var e struct {
		Error struct{ Message string } `json:"error"`
	}
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if json.Unmarshal(data, &e) == nil && e.Error.Message != "" {
		return nil, errors.New(e.Error.Message)
	}
	return nil, fmt.Errorf("admin API: %s", resp.Status)
}
