package httpapi

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"inferd/httpapi/status"
	"inferd/store"
	"inferd/webhook"
)

func TestStartWebhookFields(t *testing.T) {
	start := `{"apiKey": "` + keyAcme + `", "modelKey": "mk-echo", "modelInputs": {}, "startOnly": true`
	only, _ := webhook.ParsePolicy([]string{"10.0.0.0/8"})
	tests := []struct {
		name       string
		policy     *webhook.Policy
		extra      string
		wantErr    string // message prefix; "" for an admitted call
		wantURL    string
		wantEvents []string
	}{
		{"no webhook", nil, ``, "", "", nil},
		{"default events", nil, `, "webhook": "http://127.0.0.1:9/h"`, "", "http://127.0.0.1:9/h", nil},
		{"both events, deduplicated", nil, `, "webhook": "https://hooks.example.com/x", "webhookEvents": ["completed", "start", "start"]`, "",
			"https://hooks.example.com/x", []string{"completed", "start"}},
		{"metadata address refused", nil, `, "webhook": "http://169.254.169.254/latest"`, "error: webhook destination not allowed: 169.254.169.254", "", nil},
		{"outside the allow list", only, `, "webhook": "http://127.0.0.1:9/h"`, "error: webhook destination not allowed: 127.0.0.1", "", nil},
		{"inside the allow list", only, `, "webhook": "http://10.2.3.4/h"`, "", "http://10.2.3.4/h", nil},
		{"not a URL", nil, `, "webhook": "hooks"`, "error: webhook must be an http or https URL", "", nil},
		{"not a string", nil, `, "webhook": 5`, "error: webhook must be a string", "", nil},
		{"unknown event", nil, `, "webhook": "http://127.0.0.1:9/h", "webhookEvents": ["done"]`, `error: webhookEvents: unknown event "done"`, "", nil},
		{"events not a list", nil, `, "webhook": "http://127.0.0.1:9/h", "webhookEvents": "start"`, "error: webhookEvents must be a non-empty list", "", nil},
		{"events without a webhook", nil, `, "webhookEvents": ["start"]`, "error: webhookEvents needs a webhook URL", "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t, Options{WebhookPolicy: tc.policy})
			m := inferenceReply(t, serve(env.h, http.MethodPost, "/start/v4", start+tc.extra+"}"))
			msg := m["message"].(string)
			if tc.wantErr != "" {
				if !strings.HasPrefix(msg, tc.wantErr) {
					t.Fatalf("message %q, want prefix %q", msg, tc.wantErr)
				}
				if len(env.sched.calls) != 0 {
					t.Error("a refused start admitted a call")
				}
				return
			}
			if msg != "queued" {
				t.Fatalf("message %q, want queued", msg)
			}
			c := env.sched.calls[m["callID"].(string)].call
			if c.Webhook != tc.wantURL || !slices.Equal(c.WebhookEvents, tc.wantEvents) {
				t.Errorf("call webhook %q %v, want %q %v", c.Webhook, c.WebhookEvents, tc.wantURL, tc.wantEvents)
			}
		})
	}
}

func TestWebhookBodyIsTheCheckAnswerWithTheEvent(t *testing.T) {
	body := WebhookBody("inferd/test")
	now := time.Unix(1700000000, 0)
	c := store.Call{
		ID: "call_1", TeamID: "acme", State: store.CallSucceeded, Message: "success",
		Outputs: json.RawMessage(`{"y":2}`), Created: now, Dispatched: now, Finished: now, RunMs: 7,
	}
	d := store.Delivery{ID: store.DeliveryID(c.ID, store.EventCompleted), Event: store.EventCompleted, Created: now}
	b1, err := body(c, d)
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := body(c, d)
	if string(b1) != string(b2) {
		t.Errorf("two renderings of one delivery differ:\n%s\n%s", b1, b2)
	}
	var m map[string]any
	if err := json.Unmarshal(b1, &m); err != nil {
		t.Fatal(err)
	}
	if m["event"] != "completed" || m["callID"] != "call_1" || m["message"] != "success" || m["finished"] != true ||
		m["apiVersion"] != "inferd/test" || m["created"] != float64(now.Unix()) {
		t.Errorf("completed body %s", b1)
	}
	if out, _ := json.Marshal(m["modelOutputs"]); string(out) != `[{"y":2}]` {
		t.Errorf("modelOutputs %s", out)
	}
	d.Event, d.ID = store.EventStart, store.DeliveryID(c.ID, store.EventStart)
	b3, _ := body(c, d)
	m = nil
	_ = json.Unmarshal(b3, &m)
	if m["event"] != "start" || m["message"] != "running" || m["finished"] != false || m["modelOutputs"] != nil {
		t.Errorf("start body %s, want the call as it started running", b3)
	}
}

func TestMetricsCountWebhookDeliveries(t *testing.T) {
	got := parseExposition(t, scrape(loadedMetrics()))
	want := map[string]float64{
		`inferd_webhook_deliveries_total{result="delivered"}`: 5,
		`inferd_webhook_deliveries_total{result="gave_up"}`:   1,
		`inferd_webhook_deliveries_total{result="dropped"}`:   6,
		"inferd_webhook_retries_total":                        2,
		"inferd_webhook_pending":                              3,
		`inferd_webhook_team_pending{team="acme"}`:            3,
		`inferd_webhook_team_pending{team="beta"}`:            0,
		`inferd_webhook_team_sending{team="acme"}`:            2,
		`inferd_webhook_team_dropped_total{team="acme"}`:      6,
	}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s = %v, want %v", name, got[name], v)
		}
	}
}

func TestStatusCountsOnlyTheCallersTeamsWebhooks(t *testing.T) {
	byTeam := map[string]webhook.Stats{
		"acme":  {Delivered: 2, Pending: 1},
		"other": {Delivered: 7, GaveUp: 3},
		"":      {Delivered: 9, GaveUp: 3, Pending: 1},
	}
	env := newEnv(t, Options{Status: &status.Sources{
		Webhooks: func(team string) webhook.Stats { return byTeam[team] },
	}})
	for key, want := range map[string]webhook.Stats{keyAcme: byTeam["acme"], keyAdmin: byTeam[""]} {
		got := decode[struct {
			Webhooks *webhook.Stats `json:"webhooks"`
		}](t, serve(env.h, "GET", "/v1/status", "", "X-Service-API-Key", key))
		if got.Webhooks == nil || *got.Webhooks != want {
			t.Errorf("key %s: webhooks %+v, want %+v", key[:14], got.Webhooks, want)
		}
	}
}
