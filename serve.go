package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	vm "github.com/VictoriaMetrics/metrics"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"inferd/batches"
	"inferd/cli"
	"inferd/config"
	"inferd/gpu"
	"inferd/history"
	"inferd/httpapi"
	"inferd/httpapi/admin"
	"inferd/httpapi/metrics"
	"inferd/httpapi/status"
	"inferd/scheduler"
	"inferd/scheduler/backend/local"
	"inferd/store"
	"inferd/store/bolt"
	"inferd/webhook"
)

// serve runs the daemon until ctx ends (SIGTERM/SIGINT): it opens the store,
// binds the API and admin listeners, starts the scheduler, and on the way out
// stops them in reverse order.
func serve(ctx context.Context, cfg config.Config, stderr io.Writer) error {
	log := newLogger(cfg.Log, stderr)
	setMemoryLimit(cfg.Limits, os.Getenv, log)
	if err := cfg.EnsureDataDir(); err != nil {
		return err
	}
	gpus := gpu.Open(cfg.GPU.Simulate, cfg.GPU.Disabled, log)
	defer gpus.Close()
	replicas, err := local.New(cli.BackendConfig(cfg, gpus), log)
	if err != nil {
		return err
	}
	defer replicas.Close()         // after the scheduler has stopped every replica
	st, err := openStore(cfg, log) // bbolt, or etcd with a cluster: section
	if err != nil {
		return err
	}
	defer st.Close()

	conns, err := connLimit(cfg.Limits.MaxConnections, log)
	if err != nil {
		return err
	}
	apiLn, err := cli.ListenAPI(cfg.Listen)
	if err != nil {
		return err
	}
	adminLn, err := listenAdmin(cfg.SocketPath())
	if err != nil {
		apiLn.Close()
		return err
	}
	defer os.Remove(cfg.SocketPath())

	// One metrics set, owned by this server: no package globals.
	meters := metrics.New(vm.NewSet())
	// The status page's charts: the last 15 minutes, kept in memory. It hears
	// of finished calls from the scheduler and reads the scheduler's queues,
	// which exists only after it: hist.Run, the only reader, starts later.
	var sched *scheduler.Scheduler
	hist := history.New(history.Sources{
		Snapshot: func() scheduler.Status { return sched.Snapshot() },
		GPUs:     gpus.Devices,
	}, history.DefaultInterval, history.DefaultWindow)
	// Running calls' live events, for GET /v1/calls/:callID/events.
	streams := httpapi.NewStreams()
	schedCfg := schedulerConfig(cfg)
	schedCfg.Finals = st.finals() // cluster mode: long polls on calls run by other nodes
	schedCfg.Observer = observers{Metrics: meters, hist: hist, streams: streams}
	schedCfg.Outputs = streams
	// Without quorum (cluster mode) the jobs that read or sweep the store
	// wait for it, and each logs the outage once: losing quorum never
	// ends the node.
	outages := outageLog{log}
	schedCfg.Outages = outages
	// In cluster mode, this node's membership (cluster.go); nil on a box.
	cm, err := newClusterMode(cfg, st, func() schedulerHooks { return sched }, replicas.Capacity, log)
	if err != nil {
		return err
	}
	var routing *httpapi.Routing       // starts and cancels follow the placement; nil on a box
	var clusterView status.ClusterView // the status's cluster section, the metrics' node label; nil on a box
	var rateNodes func() int           // the nodes a key's rate is split among; nil on a box
	if cm != nil {
		rateNodes = cm.node.LiveCount
		schedCfg.Share = cm.share
		schedCfg.TeamShare = cm.node.TeamShare // one set of limits for the cluster
		routing, clusterView = cm.routing(), cm.node
	}
	sched = scheduler.New(schedCfg, st, replicas, scheduler.RealClock(), log)
	st.OnProjectChange(sched.ProjectChanged)
	st.OnTeamChange(sched.TeamChanged)
	// Webhooks: the deliverer hears of new outbox messages from the store
	// (New registers it before any call is written) and sends them apart
	// from the scheduler, which it never holds up.
	hookPolicy, err := webhook.ParsePolicy(cfg.Webhook.Allow)
	if err != nil {
		return err
	}
	hooks := webhook.New(webhook.Config{
		RetryFor: cfg.Webhook.RetryFor, FirstRetry: cfg.Webhook.FirstRetry, Timeout: cfg.Webhook.Timeout,
		Senders: cfg.Webhook.Senders, SendersPerTeam: cfg.Webhook.SendersPerTeam, MaxPendingPerTeam: cfg.Webhook.MaxPendingPerTeam,
		Policy: hookPolicy, Body: httpapi.WebhookBody("inferd/" + version), Outages: outages,
	}, st, log)
	sources := metrics.Sources{Status: sched.Snapshot, GPUs: gpus.Devices, Store: st, Conns: conns.Stats,
		Replies: sched.ReplyBytes, Webhooks: hooks.TeamStats, Cluster: clusterView}
	if st.etcd != nil {
		sources.EtcdOps = st.etcd.OpStats
	}
	meters.SetSources(sources)

	// The OpenAI Batch API: files and batches in the data dir, each line a
	// call (openai/batches).
	batchAPI, err := batches.New(batches.Config{
		Dir: filepath.Join(cfg.DataDir, "openai"), MaxFileBytes: cfg.OpenAI.MaxFileBytes, MaxTeamBytes: cfg.OpenAI.MaxTeamFileBytes,
		MaxBodyBytes: cfg.MaxBodyBytes, CreatesPerTeam: cfg.OpenAI.CreatesPerTeam, MaxFilesPerTeam: cfg.OpenAI.MaxFilesPerTeam,
		MaxQueuedPerProject: cfg.MaxQueuedPerProject, MaxQueuedBytesPerProject: cfg.MaxQueuedBytesPerProject,
		Retention: cfg.OpenAI.Retention,
		Sched:     sched, Store: st, Log: log, Node: batchNode(cm),
	})
	if err != nil {
		return err
	}

	apiCtx, endWaits := context.WithCancel(context.Background())
	defer endWaits()
	public := httpapi.New(httpapi.Options{
		StartWait:    cfg.StartWait,
		LongPollWait: cfg.LongPollWait,
		MaxBodyBytes: cfg.MaxBodyBytes,
		APIVersion:   "inferd/" + version,
		Log:          log,
		Metrics:      meters,
		Status: &status.Sources{
			Snapshot: sched.Snapshot, GPUs: gpus.Devices, Calls: st, Logs: replicas,
			History: hist, Webhooks: hooks.Stats, Protections: replicas.Protections,
			Images: replicas.ImageUsage, Live: sched.LiveCalls,
		},
		Limits: httpapi.Limits{
			RequestsPerSecond: cfg.Limits.RequestsPerSecond,
			Burst:             cfg.Limits.Burst,
			MaxWaitsPerKey:    cfg.Limits.MaxWaitsPerKey,
			MaxWaits:          cfg.Limits.MaxWaits,
			MaxInputDepth:     cfg.Limits.MaxInputDepth,
			// The edge's budgets (docs/security.md, "Budgets").
			BodyBytes:          cfg.Limits.BodyBytes,
			BodyBytesPerSource: cfg.Limits.BodyBytesPerSource,
			BodyReadTimeout:    cfg.Limits.BodyReadTimeout,
			MaxStreamsPerKey:   cfg.Limits.MaxStreamsPerKey,
			StreamResultBytes:  cfg.Limits.StreamResultBytes,
			StreamWriteTimeout: cfg.Limits.StreamWriteTimeout,
		},
		WebhookPolicy: hookPolicy,
		Streams:       streams,
		Routing:       routing,
		RateNodes:     rateNodes,
		StartLookup:   st.startLookup(),
		Cluster:       clusterView,
		// Event streams and /run waits end with the other waits.
		Stopping:        apiCtx.Done(),
		OpenAIQueueWait: cfg.OpenAI.QueueWait,
		Batches:         batchAPI,
		BatchFileBytes:  cfg.OpenAI.MaxFileBytes,
	}, st, sched)
	api := &http.Server{
		Handler: public,
		// The headers' time. A body's is limits.bodyReadTimeout, which the
		// API sets once the headers are in, in place of a ReadTimeout
		// (headers and body together).
		ReadHeaderTimeout: cfg.Limits.ReadHeaderTimeout,
		ConnState:         conns.ConnState,
		ConnContext:       conns.ConnContext,
		// Ending it ends the waits (long polls, sync starts) at shutdown:
		// each answers the call as it then stands.
		BaseContext: func(net.Listener) context.Context { return apiCtx },
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
		// The store itself, not the openedStore around it: the admin API
		// finds what only some stores can do (bbolt's WriteBackup) by its
		// methods, which the wrapper's embedded interface would hide.
		Handler: admin.New(st.daemonStore, log,
			admin.WithLogs(replicas), admin.WithCapacityCheck(sched.CapacityWarnings),
			admin.WithTeamUse(func() []scheduler.TeamStatus { return sched.Snapshot().Teams }),
			admin.WithModelCheck(replicas.Checker().Problems),
			admin.WithCancel(adminCancel(sched.Cancel, routing)), admin.WithCalls(public.OperatorCalls())),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return adminCtx },
	}
	admin.RegisterOnShutdown(endAdmin)

	log.Info().Str("listen", "http://"+apiLn.Addr().String()).Str("dataDir", cfg.DataDir).
		Int("gpus", gpus.Count()).Str("gpuSource", gpus.Source()).Str("version", version).Msg("inferd serving")

	g, gctx := errgroup.WithContext(ctx)
	schedCtx, stopSched := context.WithCancel(context.Background())
	defer stopSched()
	// The cluster node outlives the drain (its lease fences the results
	// written then) and ends, resigning and revoking its lease, once the
	// scheduler has stopped: before the store closes.
	nodeCtx, stopNode := context.WithCancel(context.Background())
	defer stopNode()
	g.Go(func() error {
		if cm != nil {
			// Every call the scheduler writes is fenced on the lease. A
			// shutdown before the first session runs it all the same, for
			// the drain to end.
			select {
			case <-cm.bound:
			case <-gctx.Done():
			}
		}
		return sched.Run(schedCtx)
	})
	if cm != nil {
		g.Go(func() error { return cm.node.Run(nodeCtx) })
		// Payload files no reference names this node for, an hour old
		// (docs/cluster.md, "Left over").
		g.Go(func() error { return cm.payloads.RunSweeper(gctx, cm.refs, cfg.SweepInterval, time.Hour) })
	}
	g.Go(func() error { return st.RunSweeper(gctx, cfg.ResultTTL, cfg.SweepInterval, outages) })
	g.Go(func() error {
		return store.RunUsageSweeper(gctx, st, time.Now, cfg.Usage.Retention, cfg.SweepInterval, outages)
	})
	g.Go(func() error { return gpus.Run(gctx, cfg.GPU.RefreshInterval) })
	g.Go(func() error {
		select {
		case err := <-st.memberErr():
			return fmt.Errorf("etcd member: %w", err)
		case <-gctx.Done():
			return nil
		}
	})
	g.Go(func() error { return hist.Run(gctx) })
	// Batches stop making calls at the shutdown; the next start resumes them.
	g.Go(func() error { return batchAPI.Run(gctx) })
	// Deliveries go on through the drain, for the calls finishing in it,
	// and stop with the waits; what is left is sent after a restart.
	g.Go(func() error { return hooks.Run(apiCtx) })
	g.Go(func() error { return serveHTTP(api, conns.Listener(apiLn)) })
	g.Go(func() error { return serveHTTP(admin, adminLn) })
	g.Go(func() error {
		<-gctx.Done()
		shutdown(cfg.ShutdownTimeout, sched, api, admin, endWaits, stopSched, log)
		stopNode()
		return nil
	})
	err = g.Wait()
	if err != nil && !errors.Is(err, context.Canceled) {
		return withRestoreHint(err) // the scheduler reads every pending call at start
	}
	log.Info().Msg("stopped")
	return nil
}

// httpShutdownGrace bounds the wait for requests still in flight once the
// drain is over: the waits among them end at once (endWaits), so only a slow
// client reading its answer can take that long.
const httpShutdownGrace = 5 * time.Second

// shutdown drains, then stops, in this order: new calls are refused while the
// running ones finish, up to timeout (the API keeps serving, so their waiting
// clients get the results and anyone may check a call); calls still running
// then end as interrupted; the waits still open answer the call as it stands
// (queued calls stay queued for the next start); the listeners close; and
// last the scheduler stops the replicas.
func shutdown(timeout time.Duration, sched *scheduler.Scheduler, api, admin *http.Server,
	endWaits, stopSched func(), log zerolog.Logger) {
	log.Info().Stringer("shutdownTimeout", timeout).Msg("shutting down: refusing new calls, letting running calls finish")
	dctx, cancel := context.WithTimeout(context.Background(), timeout)
	interrupted := sched.Drain(dctx)
	cancel()
	if interrupted > 0 {
		log.Warn().Int("calls", interrupted).Stringer("shutdownTimeout", timeout).
			Msg("calls still running at the shutdown deadline end as interrupted")
	}
	endWaits()
	sctx, cancel := context.WithTimeout(context.Background(), httpShutdownGrace)
	defer cancel()
	for _, srv := range []*http.Server{api, admin} {
		if err := srv.Shutdown(sctx); err != nil {
			log.Warn().Err(err).Msg("requests still open at shutdown; closing their connections")
			srv.Close()
		}
	}
	stopSched()
}

// connLimit raises the soft limit on open files to the hard limit and caps
// the API's connections: at maxConns, or when that is 0, at a size that
// leaves a reserve of descriptors for replicas, the data file and the admin
// socket (httpapi.DefaultMaxConnections).
func connLimit(maxConns int, log zerolog.Logger) (*httpapi.ConnLimit, error) {
	files, err := raiseFileLimit()
	if err != nil {
		return nil, err
	}
	sized := httpapi.DefaultMaxConnections(files)
	if maxConns == 0 {
		maxConns = sized
	} else if maxConns > sized {
		log.Warn().Int("maxConnections", maxConns).Uint64("openFileLimit", files).
			Msg("limits.maxConnections leaves less than the usual reserve of file descriptors; replica boots may fail under a connection flood")
	}
	log.Info().Int("maxConnections", maxConns).Uint64("openFileLimit", files).Msg("API connections capped")
	return httpapi.NewConnLimit(maxConns), nil
}

// raiseFileLimit raises the soft limit on open files to the hard limit and
// returns the limit in force. Go's runtime already raises it at start (and
// restores the old soft limit in the processes it starts, so model servers
// keep the usual one), so Setrlimit, which would end that restoring, runs only
// where the runtime did not.
func raiseFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("read the open-file limit: %w", err)
	}
	if lim.Cur < lim.Max {
		raised := syscall.Rlimit{Cur: lim.Max, Max: lim.Max}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
			return lim.Cur, nil // keep the soft limit; the cap is sized from it
		}
		lim = raised
	}
	return lim.Cur, nil
}

// withRestoreHint names the command that puts a backup in place in a
// corrupt-data-file error, which the store words without knowing the CLI.
func withRestoreHint(err error) error {
	if errors.Is(err, bolt.ErrCorrupt) {
		return fmt.Errorf("%w with `inferd restore BACKUP-FILE` (a file written by `inferd backup`)", err)
	}
	return err
}

// observers tells the metrics, the status page's history and the live
// event streams of each scheduler event (the last two need only finished
// calls).
type observers struct {
	*metrics.Metrics
	hist    *history.Recorder
	streams *httpapi.Streams
}

func (o observers) CallFinished(c store.Call) {
	o.Metrics.CallFinished(c)
	o.hist.CallFinished(c)
	o.streams.CallFinished(c)
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

func schedulerConfig(cfg config.Config) scheduler.Config {
	return scheduler.Config{
		MaxQueuedPerProject:      cfg.MaxQueuedPerProject,
		MaxQueuedBytesPerProject: cfg.MaxQueuedBytesPerProject,
		ReplyBytes:               cfg.Limits.ReplyBytes,
		MaxBootFailures:          cfg.Replica.MaxBootFailures,
		RestartBackoff:           cfg.Replica.RestartBackoff,
		MaxRestartBackoff:        cfg.Replica.MaxRestartBackoff,
		AbortGrace:               cfg.Replica.StopGrace, // a cancelled call's replica: free by then, or replaced
		UsageFlush:               cfg.Usage.FlushInterval,
	}
}
