package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"inferd/store"
)

// Defaults for the zero values of Config.
const (
	DefaultRetryFor   = 24 * time.Hour
	DefaultFirstRetry = 5 * time.Second
	DefaultTimeout    = 10 * time.Second
	// DefaultSenders bounds the attempts in flight: each holds a rendered
	// body (the call's outputs) and a connection.
	DefaultSenders = 16
	// DefaultSendersPerTeam is a team's share of the senders: a receiver
	// that never answers ties up this many, never another team's.
	DefaultSendersPerTeam = 4
	// DefaultMaxPendingPerTeam caps a team's messages in the outbox; a
	// record is a few hundred bytes.
	DefaultMaxPendingPerTeam = 10000
	// maxRetryInterval caps the doubling backoff.
	maxRetryInterval = time.Hour
)

// Config configures a Deliverer. Zero durations take the defaults.
type Config struct {
	// RetryFor is how long a message is retried after it was queued
	// (webhook.retryFor); then it is given up.
	RetryFor time.Duration
	// FirstRetry is the wait before the first retry; each further one
	// doubles it, up to an hour (webhook.firstRetry).
	FirstRetry time.Duration
	// Timeout bounds one attempt, answer included.
	Timeout time.Duration
	// Senders bounds the attempts in flight (webhook.senders), and
	// SendersPerTeam a team's share of them (webhook.sendersPerTeam, at
	// most Senders).
	Senders, SendersPerTeam int
	// MaxPendingPerTeam caps the messages a team holds in the outbox
	// (webhook.maxPendingPerTeam); over it, the team's oldest waiting
	// message is dropped: given up unsent, its lastError saying so.
	MaxPendingPerTeam int
	// Policy is checked against every address dialed; nil is the default
	// policy.
	Policy *Policy
	// Body renders a message: the check answer of call c, as event ev of
	// delivery d. Required.
	Body func(c store.Call, d store.Delivery) ([]byte, error)
	// Transport, when set, replaces the HTTP transport (tests); the policy
	// is then not applied to dials.
	Transport http.RoundTripper
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Outages is told when the first read of the outbox finds the store
	// unavailable (a cluster without quorum) and when it answers again:
	// the deliverer waits the outage out. Nil tells nothing.
	Outages store.Outages
}

// Store is what a Deliverer needs of the store.
type Store interface {
	PendingDeliveries() ([]store.Delivery, error)
	UpdateDelivery(d store.Delivery) error
	OnDeliveryQueued(fn func(store.Delivery))
	WebhookSecret(teamID string, rotate bool) (string, error)
	// GetCallResult reads the call without its inputs: a body needs its outputs only.
	GetCallResult(id string) (store.Call, error)
}

// Stats are a Deliverer's counts since it was made, for metrics and the
// status page.
type Stats struct {
	Delivered int64 `json:"delivered"` // messages answered 2xx
	Retries   int64 `json:"retries"`   // failed attempts that will be retried
	GaveUp    int64 `json:"gaveUp"`    // messages given up (retryFor passed, or a refused destination)
	Dropped   int64 `json:"dropped"`   // messages dropped unsent by the team's pending cap
	Pending   int64 `json:"pending"`   // messages queued, not yet ended
	Sending   int64 `json:"sending"`   // attempts in flight now
}

// Add adds o's counts to s.
func (s *Stats) Add(o Stats) {
	s.Delivered += o.Delivered
	s.Retries += o.Retries
	s.GaveUp += o.GaveUp
	s.Dropped += o.Dropped
	s.Pending += o.Pending
	s.Sending += o.Sending
}

// Deliverer sends the outbox's messages. Run owns its state; the store's
// hook and Stats are the only ways in from other goroutines.
type Deliverer struct {
	cfg    Config
	st     Store
	log    zerolog.Logger
	client *http.Client

	mu       sync.Mutex
	incoming []store.Delivery // queued since Run last looked
	kick     chan struct{}    // buffered: a delivery was queued
	// stats are the counts by team, under mu; Run sets Pending.
	stats map[string]*Stats
}

// New returns a Deliverer over st and registers it for the deliveries call
// writes queue from now on; Run sends them, and those already queued.
func New(cfg Config, st Store, log zerolog.Logger) *Deliverer {
	if cfg.RetryFor <= 0 {
		cfg.RetryFor = DefaultRetryFor
	}
	if cfg.FirstRetry <= 0 {
		cfg.FirstRetry = DefaultFirstRetry
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Senders <= 0 {
		cfg.Senders = DefaultSenders
	}
	if cfg.SendersPerTeam <= 0 {
		cfg.SendersPerTeam = DefaultSendersPerTeam
	}
	cfg.SendersPerTeam = min(cfg.SendersPerTeam, cfg.Senders)
	if cfg.MaxPendingPerTeam <= 0 {
		cfg.MaxPendingPerTeam = DefaultMaxPendingPerTeam
	}
	if cfg.Policy == nil {
		cfg.Policy = &Policy{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	tr := cfg.Transport
	if tr == nil {
		tr = &http.Transport{
			DialContext:           cfg.Policy.dialContext,
			TLSHandshakeTimeout:   cfg.Timeout,
			ResponseHeaderTimeout: cfg.Timeout,
			MaxIdleConnsPerHost:   2,
			IdleConnTimeout:       time.Minute,
		}
	}
	d := &Deliverer{
		cfg: cfg, st: st, log: log, kick: make(chan struct{}, 1), stats: map[string]*Stats{},
		client: &http.Client{
			Transport: tr,
			// A redirect is not an answer: the message is retried, and
			// never sent where the policy did not look.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
	st.OnDeliveryQueued(d.queued)
	return d
}

// queued is the store's hook: it runs on the store's writer, so it only
// appends and signals.
func (d *Deliverer) queued(dl store.Delivery) {
	d.mu.Lock()
	d.incoming = append(d.incoming, dl)
	d.mu.Unlock()
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// Stats returns the counts so far of team teamID's messages, or of every
// team's when teamID is "".
func (d *Deliverer) Stats(teamID string) Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	var sum Stats
	for team, s := range d.stats {
		if teamID == "" || team == teamID {
			sum.Add(*s)
		}
	}
	return sum
}

// TeamStats returns the counts so far of each team that has had a message.
func (d *Deliverer) TeamStats() map[string]Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]Stats, len(d.stats))
	for team, s := range d.stats {
		out[team] = *s
	}
	return out
}

// count changes team's counts under mu.
func (d *Deliverer) count(team string, fn func(*Stats)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.stats[team]
	if s == nil {
		s = &Stats{}
		d.stats[team] = s
	}
	fn(s)
}

// setHeld records what each team holds of the backlog now.
func (d *Deliverer) setHeld(held map[string]teamCount) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for team, s := range d.stats {
		c := held[team]
		s.Pending, s.Sending = c.pending, c.sending
		delete(held, team)
	}
	for team, c := range held {
		d.stats[team] = &Stats{Pending: c.pending, Sending: c.sending}
	}
}

// outcome is the result of one attempt.
type outcome struct {
	d   store.Delivery
	err error // nil: delivered
	// permanent failures (refused destination, expired call) are given up
	// at once.
	permanent bool
}

// Run sends the queued messages until ctx ends; then the attempts in
// flight are abandoned (their messages stay queued, and are sent after a
// restart) and Run returns nil once they have returned.
func (d *Deliverer) Run(ctx context.Context) error {
	var stored []store.Delivery
	err := store.UntilAnswered(ctx, time.Second, "read the webhook outbox", d.cfg.Outages, func() (err error) {
		stored, err = d.st.PendingDeliveries()
		return err
	})
	if ctx.Err() != nil {
		return nil
	}
	if err != nil {
		return fmt.Errorf("webhook deliverer: %w", err)
	}
	b := newBacklog()
	for _, dl := range stored {
		b.add(dl)
	}
	results := make(chan outcome, d.cfg.Senders)
	var wg sync.WaitGroup
	defer wg.Wait()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		d.mu.Lock()
		for _, dl := range d.incoming {
			b.add(dl)
		}
		d.incoming = nil
		d.mu.Unlock()
		dropped := b.trim(d.cfg.MaxPendingPerTeam)

		now := d.cfg.Now()
		for {
			dl, ok := b.next(now, d.cfg.Senders, d.cfg.SendersPerTeam)
			if !ok {
				break
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				results <- d.attempt(ctx, dl)
			}()
		}
		// After the sends have started: ending the dropped messages
		// takes a store write each.
		d.drop(dropped, now)
		d.setHeld(b.counts())
		timer.Reset(wakeAfter(b.wake(d.cfg.Senders, d.cfg.SendersPerTeam), now))
		select {
		case <-ctx.Done():
			return nil
		case <-d.kick:
		case <-timer.C:
		case o := <-results:
			if ctx.Err() != nil {
				return nil // abandoned by the shutdown: not an attempt
			}
			dl, retry := d.record(o)
			b.sent(dl, retry)
		}
	}
}

// wakeAfter is how long the loop may sleep: until the next message a
// sender could take falls due, or an hour when there is none (a result or
// a new message wakes it first).
func wakeAfter(next, now time.Time) time.Duration {
	if next.IsZero() {
		return time.Hour
	}
	return max(next.Sub(now), 0)
}

// drop ends messages dropped by their team's pending cap: each is given
// up unsent, with a lastError that says why, and counted; one log line
// per team says how many.
func (d *Deliverer) drop(dropped []store.Delivery, now time.Time) {
	byTeam := map[string]int{}
	for _, dl := range dropped {
		dl.Ended, dl.Delivered = now, false
		dl.LastError = fmt.Sprintf("dropped: team %s held more than webhook.maxPendingPerTeam (%d) messages", dl.TeamID, d.cfg.MaxPendingPerTeam)
		d.count(dl.TeamID, func(s *Stats) { s.Dropped++ })
		byTeam[dl.TeamID]++
		if err := d.st.UpdateDelivery(dl); err != nil {
			// Not ended in the store: the message is held again after a
			// restart, and dropped again if its team is still over.
			d.log.Error().Err(err).Str("webhook", dl.ID).Msg("recording a dropped webhook failed")
		}
	}
	for team, n := range byTeam {
		d.log.Warn().Str("team", team).Int("dropped", n).Int("maxPendingPerTeam", d.cfg.MaxPendingPerTeam).
			Msg("webhook messages dropped, oldest first: the team's receivers are not keeping up")
	}
}

// record stores the outcome of an attempt and reports whether the
// message waits for another attempt.
func (d *Deliverer) record(o outcome) (store.Delivery, bool) {
	dl := o.d
	now := d.cfg.Now()
	dl.Attempts++
	log := d.log.With().Str("webhook", dl.ID).Str("call", dl.CallID).Str("event", dl.Event).
		Int("attempt", dl.Attempts).Logger()
	switch {
	case o.err == nil:
		dl.Ended, dl.Delivered, dl.LastError = now, true, ""
		d.count(dl.TeamID, func(s *Stats) { s.Delivered++ })
	default:
		dl.LastError = truncate(o.err.Error(), 300)
		wait := backoff(d.cfg.FirstRetry, dl.Attempts)
		if o.permanent || now.Add(wait).After(dl.Created.Add(d.cfg.RetryFor)) {
			dl.Ended = now
			d.count(dl.TeamID, func(s *Stats) { s.GaveUp++ })
			log.Warn().Str("error", dl.LastError).Msg("webhook given up")
		} else {
			dl.NextAttempt = now.Add(wait)
			d.count(dl.TeamID, func(s *Stats) { s.Retries++ })
			log.Info().Str("error", dl.LastError).Stringer("retryIn", wait.Round(time.Millisecond)).Msg("webhook attempt failed; will retry")
		}
	}
	if err := d.st.UpdateDelivery(dl); err != nil {
		// The outbox still has the last recorded state: the message is
		// sent again after a restart, at worst once more than needed.
		log.Error().Err(err).Msg("recording a webhook attempt failed")
	}
	return dl, dl.Ended.IsZero()
}

// backoff is the wait after the n-th failed attempt: first, doubled each
// time, at most maxRetryInterval.
func backoff(first time.Duration, n int) time.Duration {
	w := first
	for i := 1; i < n && w < maxRetryInterval; i++ {
		w *= 2
	}
	return min(w, maxRetryInterval)
}

// attempt sends one message once.
func (d *Deliverer) attempt(ctx context.Context, dl store.Delivery) outcome {
	c, err := d.st.GetCallResult(dl.CallID)
	if errors.Is(err, store.ErrNotFound) {
		return outcome{d: dl, err: fmt.Errorf("call %s expired", dl.CallID), permanent: true}
	}
	if err != nil {
		return outcome{d: dl, err: err}
	}
	body, err := d.cfg.Body(c, dl)
	if err != nil {
		return outcome{d: dl, err: fmt.Errorf("render: %w", err), permanent: true}
	}
	secret, err := d.st.WebhookSecret(dl.TeamID, false)
	if err != nil {
		return outcome{d: dl, err: fmt.Errorf("team secret: %w", err)}
	}
	u, err := url.Parse(dl.URL)
	if err != nil {
		return outcome{d: dl, err: err, permanent: true}
	}
	ts := d.cfg.Now().Unix()
	sig, err := Sign(secret, dl.ID, ts, body)
	if err != nil {
		return outcome{d: dl, err: err}
	}
	actx, cancel := context.WithTimeout(context.WithValue(ctx, byNameKey{}, d.cfg.Policy.allowedByName(u)), d.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, dl.URL, bytes.NewReader(body))
	if err != nil {
		return outcome{d: dl, err: err, permanent: true}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "inferd-webhooks")
	req.Header.Set("webhook-id", dl.ID)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("webhook-signature", sig)
	resp, err := d.client.Do(req)
	if err != nil {
		return outcome{d: dl, err: err, permanent: errors.Is(err, ErrRefused)}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return outcome{d: dl, err: fmt.Errorf("HTTP %d", resp.StatusCode)}
	}
	return outcome{d: dl}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
