package httpapi

import (
	"encoding/json"
	"reflect"
	"testing"
)

// reflectRequest is inferenceRequest as encoding/json decoded it before
// decodeInferenceRequest: the same fields, matched by json.Unmarshal.
type reflectRequest struct {
	APIKey         json.RawMessage `json:"apiKey"`
	ModelKey       json.RawMessage `json:"modelKey"`
	ModelInputs    json.RawMessage `json:"modelInputs"`
	StartOnly      json.RawMessage `json:"startOnly"`
	CallID         json.RawMessage `json:"callID"`
	LongPoll       json.RawMessage `json:"longPoll"`
	Timeout        json.RawMessage `json:"timeout"`
	QueueTimeout   json.RawMessage `json:"queueTimeout"`
	Priority       json.RawMessage `json:"priority"`
	IdempotencyKey json.RawMessage `json:"idempotencyKey"`
	Webhook        json.RawMessage `json:"webhook"`
	WebhookEvents  json.RawMessage `json:"webhookEvents"`
}

// sameAsReflection fails t unless body decodes to the same fields, or the
// same error, as json.Unmarshal gives.
func sameAsReflection(t *testing.T, body []byte) {
	t.Helper()
	got, gotErr := decodeInferenceRequest(body)
	var want reflectRequest
	wantErr := decodeObject(body, &want)
	if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
		t.Fatalf("%q: error %v, encoding/json's %v", body, gotErr, wantErr)
	}
	if gotErr != nil {
		return
	}
	g, w := reflect.ValueOf(got), reflect.ValueOf(want)
	for i := range g.NumField() {
		gv, wv := g.Field(i).Bytes(), w.Field(i).Bytes()
		if string(gv) != string(wv) || (gv == nil) != (wv == nil) {
			t.Errorf("%q: %s = %q, encoding/json's %q", body, g.Type().Field(i).Name, gv, wv)
		}
	}
}

// The start and check bodies decode as encoding/json decoded them: exact and
// case-insensitive keys, escaped keys, repeats, nesting, null, odd spacing
// and every kind of bad JSON.
func TestInferenceBodyDecodesAsEncodingJSONDid(t *testing.T) {
	for _, body := range inferenceBodySeeds {
		sameAsReflection(t, []byte(body))
	}
}

var inferenceBodySeeds = []string{
	`{"apiKey": "k", "modelKey": "mk", "modelInputs": {"prompt": "hi", "n": [1, 2, {"x": "}"}]}, "startOnly": true}`,
	`{"APIKEY":"a","apikey":"b","ApiKey":"c"}`,
	`{"apiKey":"exact","APIKEY":"folded"}`,
	`{"APIKEY":"folded","apiKey":"exact"}`,
	`{"api\u004bey": "escaped", "model\"Key": 1, "callID": "c\"\\d"}`,
	`{"modelInputs": null, "longPoll": false, "timeout": -1.5e3, "priority": "high"}`,
	" \t\r\n{ \"callID\" : \"c1\" , \"longPoll\" : true } \n",
	`{"modelInputs": [], "webhookEvents": ["a", "b"], "webhook": "https://x/y?z=\"}\""}`,
	`{"unknown": {"apiKey": "nested"}, "apiKey": "top"}`,
	`{"ſtartOnly": true, "modelKey": "kelvin"}`, // Unicode folding, as bytes.EqualFold
	`{}`, ``, `  `, `[]`, `"s"`, `1`, `null`, `{`, `{"a":}`, `{"a":1,}`, `{"a" 1}`, `{"a":1}}`, `{"a":"\x"}`,
	`{"modelInputs": {"deep": [[[[[[[[[[]]]]]]]]]]}}`,
}

func FuzzInferenceBodyDecoding(f *testing.F) {
	for _, body := range inferenceBodySeeds {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		sameAsReflection(t, body)
	})
}
