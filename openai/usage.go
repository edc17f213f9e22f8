package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strconv"

	"inferd/store"
)

// usageOf is the part of a reply or chunk that carries its usage.
type usageOf struct {
	Usage *struct {
		PromptTokens     json.Number `json:"prompt_tokens"`
		CompletionTokens json.Number `json:"completion_tokens"`
	} `json:"usage"`
	Choices json.RawMessage `json:"choices"`
}

// Usage returns the token usage of a reply or stream chunk, and whether it
// has one ("usage" absent or null: none; an embeddings reply counts prompt
// tokens only). Each count is clamped to [0, store.MaxTokens]: the model's
// word is not trusted to be sane.
func Usage(reply []byte) (store.Tokens, bool) {
	var u usageOf
	if json.Unmarshal(reply, &u) != nil || u.Usage == nil {
		return store.Tokens{}, false
	}
	return store.Tokens{Prompt: tokenCount(u.Usage.PromptTokens), Completion: tokenCount(u.Usage.CompletionTokens)}, true
}

// tokenCount is a count a model reported, within [0, store.MaxTokens]: a
// number past what an int64 holds saturates rather than losing the whole
// usage, and a fraction counts its whole part.
func tokenCount(n json.Number) int64 {
	if n == "" {
		return 0
	}
	if i, err := strconv.ParseInt(string(n), 10, 64); err == nil {
		return store.ClampTokens(i)
	}
	f, err := strconv.ParseFloat(string(n), 64)
	switch {
	case err != nil && !errors.Is(err, strconv.ErrRange), math.IsNaN(f), f <= 0:
		return 0
	case f >= store.MaxTokens:
		return store.MaxTokens
	}
	return int64(f)
}

// UsageOnly reports whether a stream chunk is the one that
// stream_options.include_usage adds at the end: no choices, and a usage.
// inferd drops it from what it passes back to a client that did not ask
// for it.
func UsageOnly(chunk []byte) bool {
	var u usageOf
	if json.Unmarshal(chunk, &u) != nil || u.Usage == nil {
		return false
	}
	c := bytes.TrimSpace(u.Choices)
	return len(c) == 0 || bytes.Equal(c, []byte("[]")) || bytes.Equal(c, []byte("null"))
}
