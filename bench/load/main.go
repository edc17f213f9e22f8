// Command load sends HTTP load at a model server, a reverse proxy or inferd
// and prints latency percentiles, throughput and errors. Examples:
//
//	go run ./bench/load -target model -url http://127.0.0.1:9000/ -c 64 -d 10s
//	go run ./bench/load -target start -url http://127.0.0.1:8080 -apikey $KEY -modelkey mk-noop -c 1 -n 2000
//	go run ./bench/load -target startonly -url http://127.0.0.1:8080 -apikey $KEY -modelkey mk-noop -rate 500 -d 10s
//
// -rate 0 (the default) is a closed loop of -c workers; -rate N is an open
// loop starting N requests a second with at most -c in flight.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"inferd/bench/loadgen"
)

func main() {
	var cfg loadgen.Config
	var target, inputs string
	var asJSON bool
	flag.StringVar(&target, "target", "model", "model (POST the inputs to -url), start (sync /start/v4), startonly (startOnly + long-poll /check/v4) or openai (POST /v1/chat/completions naming -modelkey as the model)")
	flag.StringVar(&cfg.URL, "url", "", "model URL, or inferd's base URL")
	flag.StringVar(&cfg.APIKey, "apikey", os.Getenv("INFERD_API_KEY"), "inferd API key (default $INFERD_API_KEY)")
	flag.StringVar(&cfg.ModelKey, "modelkey", "", "inferd model key")
	flag.StringVar(&inputs, "inputs", `{"prompt":"hello"}`, "model inputs (a JSON object)")
	flag.IntVar(&cfg.Concurrency, "c", 1, "workers (closed loop) or most requests in flight (open loop)")
	flag.Float64Var(&cfg.Rate, "rate", 0, "requests per second (open loop); 0 = closed loop")
	flag.DurationVar(&cfg.Duration, "d", 0, "run this long")
	flag.IntVar(&cfg.Count, "n", 0, "run until this many requests have ended (overrides -d)")
	flag.IntVar(&cfg.Warmup, "warmup", 1, "unmeasured requests per worker first")
	flag.BoolVar(&asJSON, "json", false, "print the result as JSON")
	flag.Parse()
	cfg.Target = loadgen.Target(target)
	cfg.Inputs = json.RawMessage(inputs)
	if cfg.URL == "" {
		fmt.Fprintln(os.Stderr, "load: -url is required")
		os.Exit(2)
	}
	if cfg.Count == 0 && cfg.Duration == 0 {
		cfg.Duration = 10 * time.Second
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := loadgen.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
	if asJSON {
		json.NewEncoder(os.Stdout).Encode(res)
	} else {
		fmt.Println(res)
	}
	if res.Errors > 0 {
		os.Exit(1)
	}
}
