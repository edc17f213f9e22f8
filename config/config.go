// Package config loads inferd's settings from, in rising precedence: built-in
// defaults, a YAML file, INFERD_* environment variables and command-line flags.
// The result is one immutable Config value; unknown keys and invalid values stop
// start-up with a message that names the key.
package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"

	"inferd/batches"
	"inferd/gpu"
	"inferd/pipeline"
	"inferd/scheduler"
	"inferd/scheduler/backend/local"
	"inferd/webhook"
)

// Config is every setting of the daemon and the admin CLI.
type Config struct {
	Listen              string        `koanf:"listen"`
	DataDir             string        `koanf:"dataDir"`
	Log                 Log           `koanf:"log"`
	StartWait           time.Duration `koanf:"startWait"`
	LongPollWait        time.Duration `koanf:"longPollWait"`
	MaxBodyBytes        int64         `koanf:"maxBodyBytes"`
	MaxQueuedPerProject int           `koanf:"maxQueuedPerProject"`
	// MaxQueuedBytesPerProject caps the bytes of inputs waiting per project.
	MaxQueuedBytesPerProject int64         `koanf:"maxQueuedBytesPerProject"`
	CPUSlots                 int           `koanf:"cpuSlots"`
	ResultTTL                time.Duration `koanf:"resultTTL"`
	SweepInterval            time.Duration `koanf:"sweepInterval"`
	ShutdownTimeout          time.Duration `koanf:"shutdownTimeout"`
	Limits                   Limits        `koanf:"limits"`
	Replica                  Replica       `koanf:"replica"`
	GPU                      GPU           `koanf:"gpu"`
	Webhook                  Webhook       `koanf:"webhook"`
	OpenAI                   OpenAI        `koanf:"openai"`
	Usage                    Usage         `koanf:"usage"`
	Python                   Python        `koanf:"python"`
	// Cluster is set by a cluster: section (file only); nil is the
	// single-box appliance (see cluster.go).
	Cluster *Cluster `koanf:"cluster"`
}

// Webhook holds the settings of webhook delivery (see the webhook package).
type Webhook struct {
	RetryFor   time.Duration `koanf:"retryFor"`   // a message is retried this long, then given up
	FirstRetry time.Duration `koanf:"firstRetry"` // wait before the first retry; doubles, up to 1h
	Timeout    time.Duration `koanf:"timeout"`    // one attempt, answer included
	// Senders bounds the attempts in flight; SendersPerTeam is a team's
	// share of them, so a receiver that never answers holds only its own
	// team's (see the webhook package).
	Senders        int `koanf:"senders"`
	SendersPerTeam int `koanf:"sendersPerTeam"`
	// MaxPendingPerTeam caps a team's undelivered messages; over it the
	// team's oldest is dropped.
	MaxPendingPerTeam int `koanf:"maxPendingPerTeam"`
	// Allow lists the destinations webhooks may have (CIDRs, addresses,
	// host names, "*.domain"); empty allows all but link-local and cloud
	// metadata addresses.
	Allow []string `koanf:"allow"`
}

// OpenAI holds the settings of the OpenAI front door (docs/openai.md).
type OpenAI struct {
	// QueueWait is how long a request waits for a ready replica (a boot
	// from zero included) before it is answered 503 and its call expires.
	QueueWait time.Duration `koanf:"queueWait"`
	// MaxFileBytes bounds one Batch API file; MaxTeamFileBytes all files
	// of a team, batch outputs included.
	MaxFileBytes     int64 `koanf:"maxFileBytes"`
	MaxTeamFileBytes int64 `koanf:"maxTeamFileBytes"`
	// CreatesPerTeam bounds a team's POST /v1/batches under way at once
	// (each reads its input file through, a line at a time).
	CreatesPerTeam int `koanf:"createsPerTeam"`
	// MaxFilesPerTeam bounds a team's files, empty ones and those its
	// batches not yet ended will write included.
	MaxFilesPerTeam int `koanf:"maxFilesPerTeam"`
	// Retention is how long a Batch API file is kept after its creation,
	// and an ended batch (with its output files) after it ended.
	Retention time.Duration `koanf:"retention"`
}

// Python holds the settings of projects' Python environments
// (docs/python.md).
type Python struct {
	// Index is the package index an environment without a wheelhouse is
	// installed from (pip's --index-url); "" = pip's default or its own
	// configuration (/etc/pip.conf).
	Index string `koanf:"index"`
}

// PythonDir holds the projects' Python environments.
func (c Config) PythonDir() string { return filepath.Join(c.DataDir, "python") }

// Usage holds the settings of the usage ledger (docs/operations.md "Usage").
type Usage struct {
	// Retention is how long the hourly roll-ups are kept (a call's own
	// usage goes with the call, after resultTTL).
	Retention time.Duration `koanf:"retention"`
	// FlushInterval is how often replica time no call used (boot, idle) is
	// written; a crash loses at most this much of it.
	FlushInterval time.Duration `koanf:"flushInterval"`
}

// Limits bound what one client can take of the daemon (see docs/security.md).
type Limits struct {
	RequestsPerSecond float64       `koanf:"requestsPerSecond"` // per API key; 0 = unlimited
	Burst             int           `koanf:"burst"`
	MaxWaitsPerKey    int           `koanf:"maxWaitsPerKey"` // held-open start/check waits; 0 = unlimited
	MaxWaits          int           `koanf:"maxWaits"`
	MaxInputDepth     int           `koanf:"maxInputDepth"`
	ReadHeaderTimeout time.Duration `koanf:"readHeaderTimeout"`
	MaxConnections    int           `koanf:"maxConnections"` // open API connections; 0 = sized from the open-file limit
	// The edge's budgets (docs/security.md, "Budgets"): bytes of request
	// bodies being read at once, in all and per client address (0 = no
	// cap); the time to send a body; event streams per key (0 = no cap);
	// results held for event streams (0 = no cap); the time an event may
	// take to reach its reader.
	BodyBytes          int64         `koanf:"bodyBytes"`
	BodyBytesPerSource int64         `koanf:"bodyBytesPerSource"`
	BodyReadTimeout    time.Duration `koanf:"bodyReadTimeout"`
	MaxStreamsPerKey   int           `koanf:"maxStreamsPerKey"`
	StreamResultBytes  int64         `koanf:"streamResultBytes"`
	StreamWriteTimeout time.Duration `koanf:"streamWriteTimeout"`
	// ReplyBytes bounds the bytes of model replies held at once, from
	// their buffer until their call's result is stored (0 = no bound).
	ReplyBytes int64 `koanf:"replyBytes"`
	// MemoryBytes is the soft memory limit the daemon gives the Go
	// collector (runtime/debug.SetMemoryLimit); 0 = derived from the
	// budgets above (MemoryLimit).
	MemoryBytes int64 `koanf:"memoryBytes"`
}

// MemoryHeadroom is what the derived memory limit allows beyond the
// request bodies and model replies the budgets let the daemon hold: the
// runtime, the store's caches and unapplied writes, connections, and the
// pages a commit of a large payload writes.
const MemoryHeadroom = 64 << 20

// MemoryLimit returns the soft memory limit for the Go collector:
// MemoryBytes when set, else BodyBytes + ReplyBytes + MemoryHeadroom, or
// math.MaxInt64 (none) when either budget is 0 (unbounded: no limit can be
// derived from it).
//
// Why a limit at all: by default the collector lets the heap grow to twice
// what was live at the last collection, and the daemon's large garbage
// (a 60 MiB reply's copies on its way to the store) makes that twice a
// lot. With the limit the collector runs before the heap passes it, so
// the process stays near what the budgets hold. It is soft: when more is
// live (stream results, a slow store), the collector runs more often, at
// most half the CPU (the runtime's own cap), and nothing fails.
func (l Limits) MemoryLimit() int64 {
	switch {
	case l.MemoryBytes > 0:
		return l.MemoryBytes
	case l.BodyBytes == 0 || l.ReplyBytes == 0:
		return math.MaxInt64
	}
	return l.BodyBytes + l.ReplyBytes + MemoryHeadroom
}

// Log selects the log level and format.
type Log struct {
	Level  string `koanf:"level"`  // debug, info, warn, error
	Format string `koanf:"format"` // auto (console on a terminal, else JSON), console, json
}

// Replica holds the settings for model server processes.
type Replica struct {
	// User is who model processes run as when inferd has the privilege to
	// choose: PerProjectUser (a uid of each project's own from UIDRange), a
	// user name or uid for all projects, or "root".
	User                  string        `koanf:"user"`
	UIDRange              string        `koanf:"uidRange"` // FIRST-LAST, the uids PerProjectUser hands out
	Network               string        `koanf:"network"`  // "private" or "host": the default of a project's network
	Cgroups               bool          `koanf:"cgroups"`  // a cgroup per replica, where inferd can make one
	StopGrace             time.Duration `koanf:"stopGrace"`
	LogMaxBytes           int64         `koanf:"logMaxBytes"`
	LogKeep               int           `koanf:"logKeep"`
	LogMaxBytesPerProject int64         `koanf:"logMaxBytesPerProject"`
	MaxBootFailures       int           `koanf:"maxBootFailures"`
	RestartBackoff        time.Duration `koanf:"restartBackoff"`
	MaxRestartBackoff     time.Duration `koanf:"maxRestartBackoff"`
	// PassEnv names variables copied from inferd's environment to every
	// model process, beside the fixed allowlist (docs/gpu.md says which
	// ones CUDA may need).
	PassEnv []string `koanf:"passEnv"`
}

// GPU holds the settings for GPU discovery.
type GPU struct {
	Disabled        bool               `koanf:"disabled"`
	RefreshInterval time.Duration      `koanf:"refreshInterval"`
	Simulate        []gpu.SimulatedGPU `koanf:"simulate"`
	// DevDir is where the NVIDIA device nodes are, for each replica's
	// device rules: /dev, or fake nodes for tests with simulated GPUs.
	DevDir string `koanf:"devDir"`
}

// defaults mirrors config.example.yaml; TestExampleFileMatchesDefaults keeps
// the two from drifting. A setting a component has a default of its own for
// (its Default* constant, the value it takes for a zero field) is given that
// constant, so the two cannot differ.
func defaults() map[string]any {
	return map[string]any{
		"listen":                        "127.0.0.1:8080",
		"dataDir":                       "./data",
		"log.level":                     "info",
		"log.format":                    "auto",
		"startWait":                     pipeline.DefaultStartWait.String(),
		"longPollWait":                  pipeline.DefaultLongPollWait.String(),
		"maxBodyBytes":                  pipeline.DefaultMaxBodyBytes,
		"maxQueuedPerProject":           scheduler.DefaultMaxQueuedPerProject,
		"maxQueuedBytesPerProject":      scheduler.DefaultMaxQueuedBytes,
		"cpuSlots":                      0,
		"resultTTL":                     "24h",
		"sweepInterval":                 "1m",
		"shutdownTimeout":               "30s",
		"limits.requestsPerSecond":      1000,
		"limits.burst":                  2000,
		"limits.maxWaitsPerKey":         1000,
		"limits.maxWaits":               10000,
		"limits.maxInputDepth":          64,
		"limits.readHeaderTimeout":      "10s",
		"limits.maxConnections":         0,
		"limits.bodyBytes":              128 << 20,
		"limits.bodyBytesPerSource":     64 << 20,
		"limits.bodyReadTimeout":        "60s",
		"limits.maxStreamsPerKey":       100,
		"limits.streamResultBytes":      256 << 20,
		"limits.streamWriteTimeout":     "30s",
		"limits.replyBytes":             128 << 20,
		"limits.memoryBytes":            0,
		"replica.user":                  PerProjectUser,
		"replica.uidRange":              fmt.Sprintf("%d-%d", local.DefaultUIDFirst, local.DefaultUIDLast),
		"replica.network":               "private",
		"replica.cgroups":               true,
		"replica.stopGrace":             local.DefaultStopGrace.String(),
		"replica.logMaxBytes":           local.DefaultLogMaxBytes,
		"replica.logKeep":               local.DefaultLogKeep,
		"replica.logMaxBytesPerProject": local.DefaultLogMaxBytesPerProject,
		"replica.maxBootFailures":       scheduler.DefaultMaxBootFailures,
		"replica.restartBackoff":        scheduler.DefaultRestartBackoff.String(),
		"replica.maxRestartBackoff":     scheduler.DefaultMaxRestartBackoff.String(),
		"replica.passEnv":               []any{"LD_LIBRARY_PATH"},
		"gpu.disabled":                  false,
		"gpu.refreshInterval":           "5s",
		"gpu.simulate":                  []any{},
		"gpu.devDir":                    "/dev",
		"webhook.retryFor":              webhook.DefaultRetryFor.String(),
		"webhook.firstRetry":            webhook.DefaultFirstRetry.String(),
		"webhook.timeout":               webhook.DefaultTimeout.String(),
		"webhook.senders":               webhook.DefaultSenders,
		"webhook.sendersPerTeam":        webhook.DefaultSendersPerTeam,
		"webhook.maxPendingPerTeam":     webhook.DefaultMaxPendingPerTeam,
		"webhook.allow":                 []any{},
		"openai.queueWait":              pipeline.DefaultOpenAIQueueWait.String(),
		"openai.maxFileBytes":           100 << 20,
		"openai.maxTeamFileBytes":       1 << 30,
		"openai.createsPerTeam":         batches.DefaultCreatesPerTeam,
		"openai.maxFilesPerTeam":        batches.DefaultMaxFilesPerTeam,
		"openai.retention":              "720h", // batches.DefaultRetention
		"usage.retention":               "2160h",
		"usage.flushInterval":           "1m",
		"python.index":                  "",
	}
}

// Load builds the Config. file may be empty (no file); environ is the process
// environment (only INFERD_* names of known keys are read); flags maps keys to
// the values of the flags the user actually set.
func Load(path string, environ []string, flags map[string]string) (Config, error) {
	k := koanf.New(".")
	if err := k.Load(confmap.Provider(defaults(), "."), nil); err != nil {
		return Config{}, fmt.Errorf("load defaults: %w", err)
	}
	known := k.Keys()
	if path != "" {
		if err := k.Load(file.Provider(path), yaml.Parser()); err != nil {
			return Config{}, fmt.Errorf("config file %s: %w", path, err)
		}
	}
	for _, key := range fileOnly {
		if lookup(environ, EnvName(key)) {
			return Config{}, fmt.Errorf("config: %s sets %s, which can be set only in the config file", EnvName(key), key)
		}
	}
	if err := k.Load(confmap.Provider(envValues(known, environ), "."), nil); err != nil {
		return Config{}, fmt.Errorf("load environment: %w", err)
	}
	for key, val := range flags {
		if err := k.Set(key, val); err != nil {
			return Config{}, fmt.Errorf("flag for %s: %w", key, err)
		}
	}

	var cfg Config
	dc := &mapstructure.DecoderConfig{
		Result:           &cfg,
		TagName:          "koanf",
		ErrorUnused:      true,
		WeaklyTypedInput: true,
		DecodeHook: mapstructure.ComposeDecodeHookFunc(
			secondsHook,
			mapstructure.StringToTimeDurationHookFunc(),
			mapstructure.TextUnmarshallerHookFunc(),
		),
	}
	if err := k.UnmarshalWithConf("", &cfg, koanf.UnmarshalConf{DecoderConfig: dc}); err != nil {
		return Config{}, fmt.Errorf("config: %s", decodeMessage(err))
	}
	if path != "" && !filepath.IsAbs(cfg.DataDir) && k.String("dataDir") != "" && !fromEnvOrFlag("dataDir", environ, flags) {
		// A relative dataDir in a file means relative to that file, so the
		// daemon finds the same data whatever directory it is started from.
		cfg.DataDir = filepath.Join(filepath.Dir(path), cfg.DataDir)
	}
	if err := cfg.validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// EnvName is the environment variable that sets a key: INFERD_ and the key in
// upper case with dots as underscores (replica.stopGrace → INFERD_REPLICA_STOPGRACE).
func EnvName(key string) string {
	return "INFERD_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

func envValues(known []string, environ []string) map[string]any {
	byName := make(map[string]string, len(known))
	for _, key := range known {
		byName[EnvName(key)] = key
	}
	out := map[string]any{}
	for _, kv := range environ {
		name, val, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		if key, ok := byName[name]; ok {
			out[key] = val
		}
	}
	return out
}

// fileOnly are the keys no INFERD_* variable can set: lists, which an
// environment string cannot spell.
var fileOnly = []string{"gpu.simulate", "replica.passEnv", "webhook.allow"}

func fromEnvOrFlag(key string, environ []string, flags map[string]string) bool {
	if _, ok := flags[key]; ok {
		return true
	}
	return lookup(environ, EnvName(key))
}

// lookup reports whether environ sets the variable name.
func lookup(environ []string, name string) bool {
	prefix := name + "="
	for _, kv := range environ {
		if strings.HasPrefix(kv, prefix) {
			return true
		}
	}
	return false
}

// secondsHook lets a duration be written as a plain number of seconds.
func secondsHook(from, to reflect.Type, data any) (any, error) {
	if to != reflect.TypeOf(time.Duration(0)) {
		return data, nil
	}
	switch v := data.(type) {
	case int:
		return time.Duration(v) * time.Second, nil
	case int64:
		return time.Duration(v) * time.Second, nil
	case uint64:
		return time.Duration(v) * time.Second, nil
	case float64:
		return time.Duration(v * float64(time.Second)), nil
	case string:
		// INFERD_* variables and flags arrive as strings: "5" means 5s there
		// too, as in the file.
		if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
			return time.Duration(f * float64(time.Second)), nil
		}
	}
	return data, nil
}

// decodeMessage turns mapstructure's errors into one line naming the keys.
func decodeMessage(err error) string {
	// mapstructure wraps its joined errors in a "decoding failed due to the
	// following error(s):" line; the joined list inside is what names the keys.
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		err = joined.(error)
	}
	var parts []string
	for _, e := range unwrapAll(err) {
		parts = append(parts, unknownKeysMessage(e.Error()))
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

// unknownKeysMessage rewrites mapstructure's "'replica' has invalid keys: a, b"
// as "unknown setting(s): replica.a, replica.b", the keys as a user writes them;
// any other message is returned as it is.
func unknownKeysMessage(msg string) string {
	parent, keys, ok := strings.Cut(msg, " has invalid keys: ")
	if !ok {
		return msg
	}
	parent = strings.Trim(parent, "'")
	names := strings.Split(keys, ", ")
	for i, name := range names {
		if parent != "" {
			names[i] = parent + "." + name
		}
	}
	return "unknown setting(s): " + strings.Join(names, ", ")
}

func unwrapAll(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, unwrapAll(e)...)
		}
		return out
	}
	return []error{err}
}

func (c Config) validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("config: %s: "+format, append([]any{key}, args...)...))
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen", "%q is not host:port (%v)", c.Listen, err)
	}
	if c.DataDir == "" {
		bad("dataDir", "must not be empty")
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		bad("log.level", "%q is not one of debug, info, warn, error", c.Log.Level)
	}
	switch c.Log.Format {
	case "auto", "console", "json":
	default:
		bad("log.format", "%q is not one of auto, console, json", c.Log.Format)
	}
	positive := map[string]time.Duration{
		"startWait": c.StartWait, "longPollWait": c.LongPollWait, "resultTTL": c.ResultTTL,
		"sweepInterval": c.SweepInterval, "shutdownTimeout": c.ShutdownTimeout,
		"replica.stopGrace": c.Replica.StopGrace, "replica.restartBackoff": c.Replica.RestartBackoff,
		"replica.maxRestartBackoff": c.Replica.MaxRestartBackoff, "gpu.refreshInterval": c.GPU.RefreshInterval,
		"limits.readHeaderTimeout": c.Limits.ReadHeaderTimeout,
		"limits.bodyReadTimeout":   c.Limits.BodyReadTimeout, "limits.streamWriteTimeout": c.Limits.StreamWriteTimeout,
		"webhook.retryFor": c.Webhook.RetryFor, "webhook.firstRetry": c.Webhook.FirstRetry,
		"webhook.timeout": c.Webhook.Timeout, "openai.queueWait": c.OpenAI.QueueWait, "openai.retention": c.OpenAI.Retention,
		"usage.retention": c.Usage.Retention, "usage.flushInterval": c.Usage.FlushInterval,
	}
	for _, key := range sortedKeys(positive) {
		if positive[key] <= 0 {
			bad(key, "must be a positive duration, got %s", positive[key])
		}
	}
	waits := map[string]time.Duration{"startWait": c.StartWait, "longPollWait": c.LongPollWait}
	for _, key := range sortedKeys(waits) {
		if waits[key] > 10*time.Minute {
			bad(key, "must be at most 10m, got %s", waits[key])
		}
	}
	if c.MaxBodyBytes < 1024 {
		bad("maxBodyBytes", "must be at least 1024, got %d", c.MaxBodyBytes)
	}
	if c.MaxQueuedPerProject < 1 {
		bad("maxQueuedPerProject", "must be at least 1, got %d", c.MaxQueuedPerProject)
	}
	if c.MaxQueuedBytesPerProject < c.MaxBodyBytes {
		bad("maxQueuedBytesPerProject", "must be at least maxBodyBytes (%d), got %d", c.MaxBodyBytes, c.MaxQueuedBytesPerProject)
	}
	if c.Limits.RequestsPerSecond < 0 {
		bad("limits.requestsPerSecond", "must be 0 (unlimited) or more, got %g", c.Limits.RequestsPerSecond)
	}
	if c.Limits.RequestsPerSecond > 0 && c.Limits.Burst < 1 {
		bad("limits.burst", "must be at least 1 when requestsPerSecond is set, got %d", c.Limits.Burst)
	}
	if c.Limits.MaxWaitsPerKey < 0 || c.Limits.MaxWaits < 0 {
		bad("limits.maxWaitsPerKey/maxWaits", "must be 0 (unlimited) or more")
	}
	if c.Limits.MaxInputDepth < 1 || c.Limits.MaxInputDepth > 10000 {
		// encoding/json refuses more than 10000 levels anyway.
		bad("limits.maxInputDepth", "must be between 1 and 10000, got %d", c.Limits.MaxInputDepth)
	}
	bodyBudgets := map[string]int64{"limits.bodyBytes": c.Limits.BodyBytes, "limits.bodyBytesPerSource": c.Limits.BodyBytesPerSource}
	for _, key := range sortedKeys(bodyBudgets) {
		// A body's buffer grows through a copy, which holds up to about
		// one and a half times the body at once: under twice maxBodyBytes,
		// a body of that size could never be read.
		if n := bodyBudgets[key]; n != 0 && n < 2*c.MaxBodyBytes {
			bad(key, "must be 0 (no cap) or at least twice maxBodyBytes (%d), got %d", 2*c.MaxBodyBytes, n)
		}
	}
	if c.Limits.MaxStreamsPerKey < 0 {
		bad("limits.maxStreamsPerKey", "must be 0 (unlimited) or more, got %d", c.Limits.MaxStreamsPerKey)
	}
	if c.Limits.StreamResultBytes < 0 {
		bad("limits.streamResultBytes", "must be 0 (no cap) or more, got %d", c.Limits.StreamResultBytes)
	}
	if c.Limits.ReplyBytes < 0 {
		bad("limits.replyBytes", "must be 0 (no bound) or more, got %d", c.Limits.ReplyBytes)
	}
	if n := c.Limits.MemoryBytes; n != 0 && n < MemoryHeadroom {
		// Below it the collector would run all the time, for nothing.
		bad("limits.memoryBytes", "must be 0 (derived from bodyBytes and replyBytes) or at least %d, got %d", MemoryHeadroom, n)
	}
	if c.Limits.MaxConnections < 0 {
		bad("limits.maxConnections", "must be 0 (sized from the open-file limit) or more, got %d", c.Limits.MaxConnections)
	}
	if c.CPUSlots < 0 {
		bad("cpuSlots", "must be 0 (one per CPU) or more, got %d", c.CPUSlots)
	}
	if c.Replica.LogMaxBytes < 4096 {
		bad("replica.logMaxBytes", "must be at least 4096, got %d", c.Replica.LogMaxBytes)
	}
	if c.Replica.LogKeep < 1 || c.Replica.LogKeep > 100 {
		bad("replica.logKeep", "must be 1 to 100, got %d", c.Replica.LogKeep)
	}
	if c.Replica.User == "" {
		bad("replica.user", "must be %s, a user name or uid, or root", PerProjectUser)
	}
	if _, _, err := ParseUIDRange(c.Replica.UIDRange); err != nil {
		bad("replica.uidRange", "%v", err)
	}
	if c.Replica.Network != "private" && c.Replica.Network != "host" {
		bad("replica.network", "%q is not one of private, host", c.Replica.Network)
	}
	if c.Replica.LogMaxBytesPerProject < c.Replica.LogMaxBytes {
		bad("replica.logMaxBytesPerProject", "must be at least replica.logMaxBytes (%d), got %d", c.Replica.LogMaxBytes, c.Replica.LogMaxBytesPerProject)
	}
	for _, name := range c.Replica.PassEnv {
		if !envName.MatchString(name) || strings.HasPrefix(name, "INFERD_") {
			bad("replica.passEnv", "%q is not a variable name a model may get (letters, digits, _; not INFERD_*)", name)
		}
	}
	if c.Replica.MaxBootFailures < 1 {
		bad("replica.maxBootFailures", "must be at least 1, got %d", c.Replica.MaxBootFailures)
	}
	if c.OpenAI.MaxFileBytes < 1024 || c.OpenAI.MaxTeamFileBytes < c.OpenAI.MaxFileBytes {
		bad("openai.maxFileBytes/maxTeamFileBytes", "must be at least 1024, and maxTeamFileBytes at least maxFileBytes; got %d and %d",
			c.OpenAI.MaxFileBytes, c.OpenAI.MaxTeamFileBytes)
	}
	if c.OpenAI.CreatesPerTeam < 1 {
		bad("openai.createsPerTeam", "must be at least 1, got %d", c.OpenAI.CreatesPerTeam)
	}
	if c.OpenAI.MaxFilesPerTeam < 3 {
		bad("openai.maxFilesPerTeam", "must be at least 3 (an input file and a batch's two results), got %d", c.OpenAI.MaxFilesPerTeam)
	}
	if c.Webhook.Senders < 1 {
		bad("webhook.senders", "must be at least 1, got %d", c.Webhook.Senders)
	}
	if c.Webhook.SendersPerTeam < 1 || c.Webhook.SendersPerTeam > c.Webhook.Senders {
		bad("webhook.sendersPerTeam", "must be 1 to webhook.senders (%d), got %d", c.Webhook.Senders, c.Webhook.SendersPerTeam)
	}
	if c.Webhook.MaxPendingPerTeam < 1 {
		bad("webhook.maxPendingPerTeam", "must be at least 1, got %d", c.Webhook.MaxPendingPerTeam)
	}
	if _, err := webhook.ParsePolicy(c.Webhook.Allow); err != nil {
		bad("webhook.allow", "%v", err)
	}
	for i, g := range c.GPU.Simulate {
		if g.Name == "" || g.MemoryMiB == 0 {
			bad(fmt.Sprintf("gpu.simulate[%d]", i), "needs a name and memoryMiB > 0")
		}
	}
	if c.Cluster != nil {
		c.Cluster.validate(bad)
		if host, _, err := net.SplitHostPort(c.Listen); err == nil && c.Cluster.Advertise == "" {
			if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
				bad("cluster.advertise", "listen %q is every address: set the URL the other nodes reach this node at (http://10.0.0.1:8080)", c.Listen)
			}
		}
	}
	return errors.Join(errs...)
}

// PerProjectUser is replica.user's default: each project's model processes
// run under a uid of their own, from replica.uidRange (the local backend's
// PerProject).
const PerProjectUser = local.PerProject

// ParseUIDRange reads replica.uidRange, "FIRST-LAST": unprivileged uids
// (1 to 2^31-1, so never root), at least one.
func ParseUIDRange(s string) (first, last uint32, err error) {
	a, b, ok := strings.Cut(strings.TrimSpace(s), "-")
	if !ok {
		return 0, 0, fmt.Errorf("%q is not FIRST-LAST", s)
	}
	f, err1 := strconv.ParseUint(strings.TrimSpace(a), 10, 31)
	l, err2 := strconv.ParseUint(strings.TrimSpace(b), 10, 31)
	switch {
	case err1 != nil || err2 != nil:
		return 0, 0, fmt.Errorf("%q is not FIRST-LAST, two uids below 2147483648", s)
	case f == 0:
		return 0, 0, fmt.Errorf("%q includes uid 0 (root)", s)
	case l < f:
		return 0, 0, fmt.Errorf("%q ends before it starts", s)
	}
	return uint32(f), uint32(l), nil
}

// envName is what replica.passEnv accepts as a variable name.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Paths derived from the data directory.

// StorePath is the bbolt file.
func (c Config) StorePath() string { return filepath.Join(c.DataDir, "inferd.db") }

// SocketPath is the admin socket the CLI talks to.
func (c Config) SocketPath() string { return filepath.Join(c.DataDir, "inferd.sock") }

// LogDir holds the replica logs.
func (c Config) LogDir() string { return filepath.Join(c.DataDir, "logs") }

// ImageDir holds the images projects run in (package image;
// docs/images.md).
func (c Config) ImageDir() string { return filepath.Join(c.DataDir, "images") }

// RunDir holds the replica pid files used to clean up after a crash.
func (c Config) RunDir() string { return filepath.Join(c.DataDir, "run") }

// UIDFile records the uid each project's replicas run as (replica.user:
// per-project), for good.
func (c Config) UIDFile() string { return filepath.Join(c.RunDir(), "uids.json") }

// EnsureDataDir creates the data directory, private to the daemon's user,
// and makes one that exists so: an admin may have made it 0755 beforehand,
// and it holds the key hashes, the calls and every team's model logs. It
// fails when the directory is open to others and cannot be closed.
func (c Config) EnsureDataDir() error {
	if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir %s: %w", c.DataDir, err)
	}
	fi, err := os.Stat(c.DataDir)
	if err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		if err := os.Chmod(c.DataDir, perm&^0o077); err != nil {
			return fmt.Errorf("data dir %s has mode %o, open to other users, and cannot be made private (%w): chmod 700 it as its owner", c.DataDir, perm, err)
		}
	}
	return nil
}
