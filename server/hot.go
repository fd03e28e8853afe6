package server

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"time"
)

// HotJSON is one heavy hitter for GET /v1/admin/hot.
type HotJSON struct {
	Rule string `json:"rule"`
	// Key is the key in the clear, only for rules with showKeys: true;
	// KeyHash is the first 64 bits of its SHA-256 otherwise, so operators
	// can tell keys apart without the API revealing them.
	Key     string  `json:"key,omitempty"`
	KeyHash string  `json:"keyHash,omitempty"`
	Rate    float64 `json:"decisionsPerSecond"`
}

// hot lists this process's heaviest (rule, key) pairs by decisions per
// second: GET /v1/admin/hot?n=20&min=1.
func (s *Server) hot(w http.ResponseWriter, r *http.Request) {
	n, min := 20, 1.0
	if v := r.URL.Query().Get("n"); v != "" {
		x, err := strconv.Atoi(v)
		if err != nil || x < 1 || x > 1000 {
			writeBad(w, &badRequest{"n", "want 1 to 1000"})
			return
		}
		n = x
	}
	if v := r.URL.Query().Get("min"); v != "" {
		x, err := strconv.ParseFloat(v, 64)
		if err != nil || x < 0 {
			writeBad(w, &badRequest{"min", "want decisions per second >= 0"})
			return
		}
		min = x
	}
	out := []HotJSON{}
	if s.o.Share != nil {
		cfg := s.e.Config()
		for _, h := range s.o.Share.Hot.Top(n, min, time.Now().UnixNano()) {
			j := HotJSON{Rule: h.Rule, Rate: h.Rate}
			if rule := cfg.Rule(h.Rule); rule != nil && rule.ShowKeys {
				j.Key = h.Key
			} else {
				sum := sha256.Sum256([]byte(h.Key))
				j.KeyHash = hex.EncodeToString(sum[:8])
			}
			out = append(out, j)
		}
	}
	writeJSON(w, http.StatusOK, out)
}
