package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"

	vm "github.com/VictoriaMetrics/metrics"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"inferd/config"
	"inferd/gpu"
	"inferd/history"
	"inferd/httpapi"
	"inferd/scheduler"
	"inferd/scheduler/backend/local"
	"inferd/store"
	"inferd/store/bolt"
)

// serve runs the daemon until ctx ends (SIGTERM/SIGINT): it opens the store,
// binds the API and admin listeners, starts the scheduler, and on the way out
// stops them in reverse order.
func serve(ctx context.Context, cfg config.Config, stderr io.Writer) error {
	log := newLogger(cfg.Log, stderr)
	if err := cfg.EnsureDataDir(); err != nil {
		return err
	}
	gpus := discoverGPUs(cfg.GPU, log)
	defer gpus.Close()
	replicas, err := local.New(backendConfig(cfg, gpus), log)
	if err != nil {
		return err
	}
	st, err := bolt.Open(cfg.StorePath(), bolt.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	if m := st.Migration(); m.Migrated() {
		log.Warn().Int("from", m.From).Int("to", m.To).Str("copy", m.Copy).
			Msg("migrated the data file to a newer schema; the copy holds the old data for a downgrade")
	}

	apiLn, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	adminLn, err := listenAdmin(cfg.SocketPath())
	if err != nil {
		apiLn.Close()
		return err
	}
	defer os.Remove(cfg.SocketPath())

	// One metrics set, owned by this server: no package globals.
	metrics := httpapi.NewMetrics(vm.NewSet())
	// The status page's charts: the last 15 minutes, kept in memory. It hears
	// of finished calls from the scheduler and reads the scheduler's queues,
	// which exists only after it: hist.Run, the only reader, starts later.
	var sched *scheduler.Scheduler
	hist := history.New(history.Sources{
		Snapshot: func() scheduler.Status { return sched.Snapshot() },
		GPUs:     gpus.Devices,
	}, history.DefaultInterval, history.DefaultWindow)
	schedCfg := schedulerConfig(cfg)
	schedCfg.Observer = observers{Metrics: metrics, hist: hist}
	sched = scheduler.New(schedCfg, st, replicas, scheduler.RealClock(), log)
	metrics.SetSources(httpapi.MetricsSources{Status: sched.Snapshot, GPUs: gpus.Devices, Store: st})
	st.OnProjectChange(sched.ProjectChanged)

	api := &http.Server{
		Handler: httpapi.New(httpapi.Options{
			StartWait:    cfg.StartWait,
			LongPollWait: cfg.LongPollWait,
			MaxBodyBytes: cfg.MaxBodyBytes,
			APIVersion:   "inferd/" + version,
			Log:          log,
			Metrics:      metrics,
			Status: &httpapi.StatusSources{
				Snapshot: sched.Snapshot, GPUs: gpus.Devices, Calls: st, Logs: replicas,
				History: hist,
			},
			Limits: httpapi.Limits{
				RequestsPerSecond: cfg.Limits.RequestsPerSecond,
				Burst:             cfg.Limits.Burst,
				MaxWaitsPerKey:    cfg.Limits.MaxWaitsPerKey,
				MaxWaits:          cfg.Limits.MaxWaits,
				MaxInputDepth:     cfg.Limits.MaxInputDepth,
			},
		}, st, sched),
		ReadHeaderTimeout: cfg.Limits.ReadHeaderTimeout,
		ReadTimeout:       2 * time.Minute,
		// Long enough for the longest wait the API holds a request open.
		WriteTimeout:   max(cfg.StartWait, cfg.LongPollWait) + time.Minute,
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
	}
	// Followed logs (inferd logs -f) run until the client hangs up: Shutdown
	// ends them through the base context, or it would wait them out.
	adminCtx, endAdmin := context.WithCancel(context.Background())
	defer endAdmin()
	admin := &http.Server{
		Handler: httpapi.NewAdmin(st, log,
			httpapi.AdminLogs(replicas), httpapi.WithCapacityCheck(sched.CapacityWarnings)),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return adminCtx },
	}
	admin.RegisterOnShutdown(endAdmin)

	log.Info().Str("listen", "http://"+apiLn.Addr().String()).Str("dataDir", cfg.DataDir).
		Int("gpus", gpus.Count()).Str("gpuSource", gpus.Source()).Str("version", version).Msg("inferd serving")

	g, gctx := errgroup.WithContext(ctx)
	schedCtx, stopSched := context.WithCancel(context.Background())
	defer stopSched()
	g.Go(func() error { return sched.Run(schedCtx) })
	g.Go(func() error { return st.RunSweeper(gctx, cfg.ResultTTL, cfg.SweepInterval) })
	g.Go(func() error { return gpus.Run(gctx, cfg.GPU.RefreshInterval) })
	g.Go(func() error { return hist.Run(gctx) })
	g.Go(func() error { return serveHTTP(api, apiLn) })
	g.Go(func() error { return serveHTTP(admin, adminLn) })
	g.Go(func() error {
		<-gctx.Done()
		log.Info().Msg("shutting down")
		sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		// Stop taking requests first, then stop the replicas: calls still
		// running are recorded as interrupted and answered after a restart.
		errs := errors.Join(api.Shutdown(sctx), admin.Shutdown(sctx))
		stopSched()
		return errs
	})
	err = g.Wait()
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	log.Info().Msg("stopped")
	return nil
}

// observers tells the metrics and the status page's history of each
// scheduler event (the history needs only finished calls).
type observers struct {
	*httpapi.Metrics
	hist *history.Recorder
}

func (o observers) CallFinished(c store.Call) {
	o.Metrics.CallFinished(c)
	o.hist.CallFinished(c)
}

func serveHTTP(srv *http.Server, ln net.Listener) error {
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve %s: %w", ln.Addr(), err)
	}
	return nil
}

// listenAdmin binds the admin socket, readable and writable by the daemon's
// user only: whoever can open it administers inferd. The store's file lock
// already guarantees no other daemon owns this data dir, so a socket file
// found here is stale.
func listenAdmin(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale admin socket %s: %w", path, err)
	}
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on admin socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("restrict admin socket %s: %w", path, err)
	}
	return ln, nil
}

func discoverGPUs(c config.GPU, log zerolog.Logger) *gpu.Inventory {
	switch {
	case len(c.Simulate) > 0:
		log.Info().Int("count", len(c.Simulate)).Msg("using simulated GPUs")
		return gpu.Simulated(c.Simulate)
	case c.Disabled:
		log.Info().Msg("GPU discovery disabled: running on CPU only")
		return gpu.Simulated(nil)
	default:
		return gpu.Discover(log)
	}
}

func schedulerConfig(cfg config.Config) scheduler.Config {
	return scheduler.Config{
		MaxQueuedPerProject:      cfg.MaxQueuedPerProject,
		MaxQueuedBytesPerProject: cfg.MaxQueuedBytesPerProject,
		MaxBootFailures:          cfg.Replica.MaxBootFailures,
		RestartBackoff:           cfg.Replica.RestartBackoff,
		MaxRestartBackoff:        cfg.Replica.MaxRestartBackoff,
	}
}

// backendConfig is how the local-process backend runs replicas: its logs,
// pid files, model user, stop grace, and what it places them on.
func backendConfig(cfg config.Config, gpus *gpu.Inventory) local.Config {
	return local.Config{
		LogDir:      cfg.LogDir(),
		LogMaxBytes: cfg.Replica.LogMaxBytes,
		LogKeep:     cfg.Replica.LogKeep,
		RunDir:      cfg.RunDir(),
		User:        cfg.Replica.User,
		StopGrace:   cfg.Replica.StopGrace,
		CPUSlots:    cfg.CPUSlots, // 0 = one per CPU
		GPUs:        gpus,
		PassEnv:     cfg.Replica.PassEnv,
	}
}
