package main

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
	"inferd/httpapi"
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
	if conn, err := net.DialTimeout("unix", sock, time.Second); err == nil {
		conn.Close()
		tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}
		return &adminClient{http: &http.Client{Transport: tr}, close: func() error { tr.CloseIdleConnections(); return nil }}, nil
	}
	if err := cfg.EnsureDataDir(); err != nil {
		return nil, err
	}
	st, err := bolt.Open(cfg.StorePath(), bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("no daemon answers on %s, and the data file cannot be opened: %w", sock, err)
	}
	h := httpapi.NewAdmin(st, zerolog.Nop(), httpapi.AdminLogDir(cfg.LogDir()))
	return &adminClient{http: &http.Client{Transport: handlerTransport{h}}, close: st.Close, inProcess: true}, nil
}

// handlerTransport serves requests with an in-process handler.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, req)
	return rec.Result(), nil
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
	req, err := http.NewRequestWithContext(ctx, method, "http://inferd"+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("admin API: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("admin API: read reply: %w", err)
	}
	if resp.StatusCode >= 300 {
		var e struct {
			Error struct{ Message string } `json:"error"`
		}
		if json.Unmarshal(data, &e) == nil && e.Error.Message != "" {
			return errors.New(e.Error.Message)
		}
		return fmt.Errorf("admin API: %s", resp.Status)
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
// arrives; an error reply becomes an error. It returns the reply's headers.
func (c *adminClient) stream(ctx context.Context, path string, w io.Writer) (http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://inferd"+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("admin API: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var e struct {
			Error struct{ Message string } `json:"error"`
		}
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(data, &e) == nil && e.Error.Message != "" {
			return nil, errors.New(e.Error.Message)
		}
		return nil, fmt.Errorf("admin API: %s", resp.Status)
	}
	if _, err := io.Copy(w, resp.Body); err != nil && ctx.Err() == nil {
		return resp.Header, fmt.Errorf("admin API: %w", err)
	}
	return resp.Header, nil
}

// withAdmin runs fn with an admin client and closes it afterwards.
func withAdmin(cfg config.Config, fn func(*adminClient) error) error {
	c, err := dialAdmin(cfg)
	if err != nil {
		return err
	}
	defer c.close()
	return fn(c)
}
