package main

import (
	"io"
	"os"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"inferd/config"
)

// newLogger writes human-readable lines to a terminal and JSON otherwise
// (journald, files, pipes), as log.format says.
func newLogger(c config.Log, w io.Writer) zerolog.Logger {
	level, err := zerolog.ParseLevel(c.Level)
	if err != nil {
		level = zerolog.InfoLevel
	}
	console := c.Format == "console"
	if c.Format == "auto" {
		if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
			console = true
		}
	}
	if console {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger()
}

// outageLog logs the store outages a periodic job meets (store.Outages):
// one line when the job first finds the store unavailable, one when it
// answers again.
type outageLog struct{ log zerolog.Logger }

func (o outageLog) Down(job string, err error) {
	o.log.Warn().Err(err).Str("job", job).Msg("store unavailable (no quorum?); trying again at every tick until it answers")
}

func (o outageLog) Up(job string) {
	o.log.Info().Str("job", job).Msg("store available again; the job runs as before")
}
