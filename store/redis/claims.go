package redis

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// A quota bucket's claims: what each process serving Envoys' quota streams
// asks of the bucket, kept in the store with an expiry, so that every
// process divides the bucket's limit among all of them (package rlqs).

var claimsScript = rueidis.NewLuaScript(luaFile("claims"))

// maxClaimants bounds the processes one bucket's claims hold.
const maxClaimants = 1024

// Claims implements rlqs.Fleet: it records process id's claim on bucket for
// ttl and returns the other processes' live claims.
func (s *Store) Claims(ctx context.Context, bucket, id string, claim float64, ttl time.Duration) ([]float64, error) {
	c := s.conn()
	if c == nil {
		return nil, s.notConnected()
	}
	sum := sha256.Sum256([]byte(bucket))
	key := s.prefix + "rlqs:" + hex.EncodeToString(sum[:16])
	vs, err := claimsScript.Exec(ctx, c, []string{key}, []string{id, strconv.FormatFloat(claim, 'g', -1, 64),
		strconv.FormatInt(max(ttl.Milliseconds(), 1), 10), strconv.Itoa(maxClaimants)}).AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("redis: quota claims: %w", err)
	}
	out := make([]float64, 0, len(vs))
	for _, v := range vs {
		if v == "full" {
			return out, fmt.Errorf("redis: quota claims: %d processes claim this bucket already", maxClaimants)
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, fmt.Errorf("redis: quota claims: %q: %w", v, err)
		}
		out = append(out, f)
	}
	return out, nil
}
