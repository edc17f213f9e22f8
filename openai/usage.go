package openai

import (
	"bytes"
	"encoding/json"

	"inferd/store"
)

// usageOf is the part of a reply or chunk that carries its usage.
type usageOf struct {
	Usage *struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
	} `json:"usage"`
	Choices json.RawMessage `json:"choices"`
}

// Usage returns the token usage of a reply or stream chunk, and whether it
// has one ("usage" absent or null: none; an embeddings reply counts prompt
// tokens only).
func Usage(reply []byte) (store.Tokens, bool) {
	var u usageOf
	if json.Unmarshal(reply, &u) != nil || u.Usage == nil {
		return store.Tokens{}, false
	}
	return store.Tokens{Prompt: max(u.Usage.PromptTokens, 0), Completion: max(u.Usage.CompletionTokens, 0)}, true
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
