package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Profiles of the daemon under load (-profile DIR): the suite starts inferd
// with INFERD_PPROF set, which a build with -tags pprof serves (pprof.go in
// the main package; a release build ignores it). For each inferd slice of
// the first round it saves a CPU profile and the block and mutex profiles
// and the allocations before and after (compare with go tool pprof -base), and for the second
// round an execution trace, named after the step's spec:
//
//	go build -tags pprof -o bench/out/inferd-pprof .
//	go run ./bench/suite -inferd bench/out/inferd-pprof -profile bench/out/prof -only quick
//	go tool pprof -top bench/out/prof/<spec>.cpu.pprof
//	go tool trace bench/out/prof/<spec>.trace

// pprofEnv is the single box's environment for -profile: a free loopback
// address to serve pprof on, kept in e.pprof.
func (o options) pprofEnv(e *env) ([]string, error) {
	if o.profile == "" {
		return nil, nil
	}
	if err := os.MkdirAll(o.profile, 0o755); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	e.pprof = fmt.Sprintf("127.0.0.1:%d", port)
	return []string{"INFERD_PPROF=" + e.pprof}, nil
}

// sliceProfile is the profiling of one slice: finish waits for it.
type sliceProfile struct {
	wg    sync.WaitGroup
	after func()
}

func (p *sliceProfile) finish() {
	if p == nil {
		return
	}
	p.wg.Wait()
	if p.after != nil {
		p.after()
	}
}

// profiler starts profiling spec s's slice of the given round, or returns
// nil when there is nothing to take.
func (o options) profiler(ctx context.Context, s runSpec, round int) *sliceProfile {
	if o.profile == "" || s.pprof == "" || round > 1 {
		return nil
	}
	name := strings.NewReplacer(" ", "-", ",", "", "×", "x", "=", "").Replace(s.name)
	base := "http://" + s.pprof + "/debug/pprof/"
	secs := max(1, int(o.phase/time.Second))
	save := func(path, file string) {
		if err := fetchTo(ctx, base+path, filepath.Join(o.profile, file)); err != nil {
			fmt.Fprintf(os.Stderr, "bench: profile %s: %v\n", file, err)
		}
	}
	p := &sliceProfile{}
	if round == 1 {
		p.wg.Go(func() { save(fmt.Sprintf("trace?seconds=%d", secs), name+".trace") })
		return p
	}
	save("block", name+".block0.pprof")
	save("mutex", name+".mutex0.pprof")
	save("allocs", name+".allocs0.pprof")
	p.wg.Go(func() { save(fmt.Sprintf("profile?seconds=%d", secs), name+".cpu.pprof") })
	p.after = func() {
		save("block", name+".block.pprof")
		save("mutex", name+".mutex.pprof")
		save("allocs", name+".allocs.pprof")
	}
	return p
}

func fetchTo(ctx context.Context, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: HTTP %d", url, resp.StatusCode)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
