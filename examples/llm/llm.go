// Package llm is a fake completion service for the LLM-gateway example: it
// answers POST /v1/chat/completions as OpenAI-style APIs do, with the tokens
// used in usage.total_tokens, so that `sluice gateway` can settle each
// request's reservation at its real cost.
//
// Its tokens are counted the simple way: a prompt costs one token per four
// bytes of its messages (at least one), and the answer is as long as the
// request's fake_completion_tokens field says (a hook for tests and
// demonstrations; 100 by default), but never more than max_tokens.
package llm

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// ChatRequest is the part of a completion request the fake reads.
type ChatRequest struct {
	Model     string `json:"model"`
	MaxTokens int64  `json:"max_tokens"`
	Messages  []struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"messages"`
	// FakeCompletionTokens is how long the fake's answer is (default 100).
	FakeCompletionTokens int64 `json:"fake_completion_tokens"`
}

// Usage is the token count of an answer.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

// Tokens returns what the fake charges for req.
func Tokens(req *ChatRequest) Usage {
	var prompt int64
	for _, m := range req.Messages {
		prompt += int64(len(m.Content))
	}
	u := Usage{PromptTokens: max((prompt+3)/4, 1), CompletionTokens: 100}
	if req.FakeCompletionTokens > 0 {
		u.CompletionTokens = req.FakeCompletionTokens
	}
	if req.MaxTokens > 0 {
		u.CompletionTokens = min(u.CompletionTokens, req.MaxTokens)
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

// Handler answers completion requests.
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		var req ChatRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
			http.Error(w, "want a JSON completion request", http.StatusBadRequest)
			return
		}
		u := Tokens(&req)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{
			"id": "chatcmpl-fake", "object": "chat.completion", "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop",
				"message": map[string]string{"role": "assistant", "content": fmt.Sprintf("(%d tokens of answer)", u.CompletionTokens)}}},
			"usage": u,
		})
	})
	return mux
}
