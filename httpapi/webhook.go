package httpapi

import (
	"encoding/json"
	"slices"

	"github.com/google/uuid"

	"inferd/store"
)

// maxWebhookURL bounds a webhook URL, which is stored with the call.
const maxWebhookURL = 2048

// decodeWebhook checks a start's webhook and webhookEvents fields. A URL
// the policy refuses fails the start, so that a client learns it at once
// rather than waiting for a message that will never come.
func (a *api) decodeWebhook(rawURL, rawEvents json.RawMessage) (string, []string, error) {
	if isAbsent(rawURL) {
		if !isAbsent(rawEvents) {
			return "", nil, badRequest("webhookEvents needs a webhook URL")
		}
		return "", nil, nil
	}
	u, err := requiredString("webhook", rawURL, badRequest("webhook must be a non-empty URL"))
	if err != nil {
		return "", nil, err
	}
	if len(u) > maxWebhookURL {
		return "", nil, badRequest("webhook URL is longer than %d bytes", maxWebhookURL)
	}
	if err := a.opts.WebhookPolicy.CheckURL(u); err != nil {
		return "", nil, badRequest("%s", err.Error())
	}
	if isAbsent(rawEvents) {
		return u, nil, nil
	}
	var events []string
	if err := json.Unmarshal(rawEvents, &events); err != nil || len(events) == 0 {
		return "", nil, badRequest(`webhookEvents must be a non-empty list of "start" and "completed"`)
	}
	for _, ev := range events {
		if ev != store.EventStart && ev != store.EventCompleted {
			return "", nil, badRequest(`webhookEvents: unknown event %q; use "start" and "completed"`, truncate(ev, 40))
		}
	}
	slices.Sort(events)
	return u, slices.Compact(events), nil
}

// webhookMessage is the body of a webhook: the check answer of the call
// and the event.
type webhookMessage struct {
	inferenceResponse
	Event string `json:"event"`
}

// WebhookBody renders delivery d of call c: the check answer a client
// polling for the call would get (for a start event, the call as it was
// when it started running) plus the event. Its id and created come from the
// delivery, so every attempt sends the same body.
func WebhookBody(apiVersion string) func(c store.Call, d store.Delivery) ([]byte, error) {
	a := &api{opts: Options{APIVersion: apiVersion}.withDefaults()}
	return func(c store.Call, d store.Delivery) ([]byte, error) {
		if d.Event == store.EventStart {
			c.State, c.Outputs, c.Message, c.RunMs = store.CallRunning, nil, "", 0
		}
		resp := a.callResponse(c, reachesNone)
		resp.ID = uuid.NewSHA1(uuid.NameSpaceURL, []byte(d.ID)).String()
		resp.Created = d.Created.Unix()
		ans, err := resp.answer(webhookMessage{inferenceResponse: resp, Event: d.Event})
		if err != nil {
			return nil, err
		}
		return ans.Bytes(), nil
	}
}
