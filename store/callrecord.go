package store

import (
	"encoding/json"
	"strconv"
	"time"

	"inferd/internal/jsonw"
)

// AppendRecord appends c's record, c as json.Marshal encodes it less its
// Inputs and Outputs (the stores keep those apart, or splice them in as they
// are), written field by field: a write of a call encodes one on every
// move, and json.Marshal's reflection was a measurable part of a call's CPU.
// TestAppendRecordIsJSONMarshal holds it to json.Marshal, every field set;
// a field added to Call must be added here, in the struct's order. A time
// json.Marshal refuses is its error, as json.Marshal gives it.
func AppendRecord(dst []byte, c Call) ([]byte, error) {
	start := len(dst)
	ok := true
	dst = append(dst, `{"id":`...)
	dst = jsonw.String(dst, c.ID)
	dst = append(dst, `,"projectId":`...)
	dst = jsonw.String(dst, c.ProjectID)
	dst = append(dst, `,"teamId":`...)
	dst = jsonw.String(dst, c.TeamID)
	dst = append(dst, `,"state":`...)
	dst = jsonw.String(dst, string(c.State))
	dst = optString(dst, `,"message":`, c.Message)
	if f := c.Failure; f != nil {
		dst = append(dst, `,"failure":{"kind":`...)
		dst = jsonw.String(dst, string(f.Kind))
		dst = optInt(dst, `,"status":`, int64(f.Status))
		dst = optString(dst, `,"retryAfter":`, f.RetryAfter)
		dst = optString(dst, `,"body":`, f.Body)
		dst = append(dst, '}')
	}
	dst = append(dst, `,"attempt":`...)
	dst = strconv.AppendInt(dst, int64(c.Attempt), 10)
	dst = optString(dst, `,"replicaId":`, c.ReplicaID)
	dst = append(dst, `,"created":`...)
	dst, ok = appendTime(dst, c.Created, ok)
	if !c.Dispatched.IsZero() {
		dst = append(dst, `,"dispatched":`...)
		dst, ok = appendTime(dst, c.Dispatched, ok)
	}
	if !c.Finished.IsZero() {
		dst = append(dst, `,"finished":`...)
		dst, ok = appendTime(dst, c.Finished, ok)
	}
	dst = optInt(dst, `,"queueMs":`, c.QueueMs)
	dst = optInt(dst, `,"bootMs":`, c.BootMs)
	dst = optInt(dst, `,"runMs":`, c.RunMs)
	dst = optInt(dst, `,"batchSize":`, int64(c.BatchSize))
	dst = optInt(dst, `,"batchWaitMs":`, c.BatchWaitMs)
	dst = optString(dst, `,"priority":`, string(c.Priority))
	dst = optInt(dst, `,"timeout":`, int64(c.Timeout))
	dst = optInt(dst, `,"queueTimeout":`, int64(c.QueueTimeout))
	dst = optString(dst, `,"idempotencyKey":`, c.IdempotencyKey)
	dst = optString(dst, `,"requestHash":`, c.RequestHash)
	dst = optString(dst, `,"route":`, c.Route)
	if c.Streamed {
		dst = append(dst, `,"streamed":true`...)
	}
	dst = optString(dst, `,"webhook":`, c.Webhook)
	if len(c.WebhookEvents) > 0 {
		dst = append(dst, `,"webhookEvents":[`...)
		for i, e := range c.WebhookEvents {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = jsonw.String(dst, e)
		}
		dst = append(dst, ']')
	}
	if t := c.Tokens; t != nil {
		dst = append(dst, `,"tokens":{"prompt":`...)
		dst = strconv.AppendInt(dst, t.Prompt, 10)
		dst = append(dst, `,"completion":`...)
		dst = strconv.AppendInt(dst, t.Completion, 10)
		dst = append(dst, '}')
	}
	if u := c.Usage; u != nil {
		dst, ok = appendUsage(dst, u, ok)
	}
	dst = append(dst, '}')
	if !ok {
		c.Inputs, c.Outputs = nil, nil
		b, err := json.Marshal(c)
		if err != nil {
			return dst[:start], err
		}
		return append(dst[:start], b...), nil
	}
	return dst, nil
}

// appendUsage appends u as the record's "usage" field; ok turns false when
// one of its figures is one json.Marshal refuses (NaN, an infinity).
func appendUsage(dst []byte, u *CallUsage, ok bool) ([]byte, bool) {
	dst = append(dst, `,"usage":{"replicaSeconds":`...)
	dst, ok = appendFloat(dst, u.ReplicaSeconds, ok)
	if u.GPUSeconds != 0 {
		dst = append(dst, `,"gpuSeconds":`...)
		dst, ok = appendFloat(dst, u.GPUSeconds, ok)
	}
	if u.CPUSeconds != nil {
		dst = append(dst, `,"cpuSeconds":`...)
		dst, ok = appendFloat(dst, *u.CPUSeconds, ok)
	}
	dst = optInt(dst, `,"peakMemoryBytes":`, u.PeakMemoryBytes)
	dst = append(dst, `,"bytesIn":`...)
	dst = strconv.AppendInt(dst, u.BytesIn, 10)
	dst = append(dst, `,"bytesOut":`...)
	dst = strconv.AppendInt(dst, u.BytesOut, 10)
	if u.EnergyJoules != nil {
		dst = append(dst, `,"energyJoules":`...)
		dst, ok = appendFloat(dst, *u.EnergyJoules, ok)
	}
	dst = optInt(dst, `,"promptTokens":`, u.PromptTokens)
	dst = optInt(dst, `,"completionTokens":`, u.CompletionTokens)
	return append(dst, '}'), ok
}

func appendFloat(dst []byte, f float64, ok bool) ([]byte, bool) {
	dst, fits := jsonw.Float(dst, f)
	return dst, ok && fits
}

func optString(dst []byte, field, s string) []byte {
	if s == "" {
		return dst
	}
	return jsonw.String(append(dst, field...), s)
}

func optInt(dst []byte, field string, n int64) []byte {
	if n == 0 {
		return dst
	}
	return strconv.AppendInt(append(dst, field...), n, 10)
}

func appendTime(dst []byte, t time.Time, ok bool) ([]byte, bool) {
	dst, fits := jsonw.Time(dst, t)
	return dst, ok && fits
}
