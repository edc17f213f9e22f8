package testenv

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// WebhookTolerance is how far a webhook's timestamp may be from the
// receiver's clock: the Standard Webhooks reference libraries' default.
const WebhookTolerance = 5 * time.Minute

// VerifyStandardWebhook checks a webhook as a receiver following the
// Standard Webhooks spec (https://www.standardwebhooks.com) does, with
// nothing of inferd's code: webhook-timestamp is integer Unix seconds
// within WebhookTolerance of now (the receiver's clock when the message
// arrived), and one of the space-separated "v1,<base64>" signatures of
// webhook-signature is the HMAC-SHA256 of "id.timestamp.body", keyed with
// the base64-decoded secret after "whsec_". A nil error means the receiver
// accepts the message.
func VerifyStandardWebhook(secret string, h http.Header, body []byte, now time.Time) error {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil || !strings.HasPrefix(secret, "whsec_") {
		return fmt.Errorf("secret %q is not whsec_<base64>", secret)
	}
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return fmt.Errorf("webhook-id %q, webhook-timestamp %q or webhook-signature %q missing", id, ts, sigs)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("webhook-timestamp %q is not integer Unix seconds", ts)
	}
	if skew := now.Sub(time.Unix(sec, 0)).Abs(); skew > WebhookTolerance {
		return fmt.Errorf("webhook-timestamp %s is %s from the receiver's clock %s (tolerance %s)",
			ts, skew, now.UTC().Format(time.RFC3339), WebhookTolerance)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, sig := range strings.Fields(sigs) {
		if hmac.Equal([]byte(sig), []byte(want)) {
			return nil
		}
	}
	return errors.New("no webhook-signature verifies with the secret")
}
