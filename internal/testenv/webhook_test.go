package testenv

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// The Standard Webhooks spec's own example message (its reference
// libraries test with it): a receiver must accept it at its timestamp and
// refuse it once the timestamp is out of tolerance, or with another secret.
func TestVerifyStandardWebhookAsTheSpecsExample(t *testing.T) {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	body := []byte(`{"test": 2432232314}`)
	h := http.Header{}
	h.Set("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
	h.Set("webhook-timestamp", "1614265330")
	h.Set("webhook-signature", "v1,bm9ldHU= v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
	sent := time.Unix(1614265330, 0)

	if err := VerifyStandardWebhook(secret, h, body, sent.Add(4*time.Minute)); err != nil {
		t.Errorf("the spec's example within tolerance: %v", err)
	}
	for what, now := range map[string]time.Time{"six minutes late": sent.Add(6 * time.Minute), "six minutes early": sent.Add(-6 * time.Minute)} {
		if err := VerifyStandardWebhook(secret, h, body, now); err == nil || !strings.Contains(err.Error(), "tolerance") {
			t.Errorf("%s: %v, want a timestamp refusal", what, err)
		}
	}
	if err := VerifyStandardWebhook("whsec_"+strings.Repeat("A", 32), h, body, sent); err == nil {
		t.Error("another secret verified the message")
	}
	if err := VerifyStandardWebhook(secret, h, []byte(`{"test": 2432232315}`), sent); err == nil {
		t.Error("a changed body verified")
	}
	h.Set("webhook-timestamp", "1614265330000")
	if err := VerifyStandardWebhook(secret, h, body, sent); err == nil {
		t.Error("a timestamp in milliseconds verified")
	}
}
