package redis

import "testing"

// Reference slots: the CRC16/XMODEM check value, and what Redis 7's
// CLUSTER KEYSLOT answers for each key (asked of a real cluster node).
func TestSlotMatchesRedisCluster(t *testing.T) {
	for key, want := range map[string]uint16{
		"123456789":            12739, // the CRC16 check value 0x31C3, mod 16384
		"foo":                  12182,
		"user1000":             3443,
		"{user1000}.following": 3443, // the tag alone is hashed
		"foo{}{bar}":           8363, // an empty first tag hashes the whole key
		"{a}b":                 15495,
		"a":                    15495,
		"}x":                   410,
		"{}x}":                 10489,
		"sluice:{%7Dx}:r:1":    13737, // the store's escaped tag for the key "}x"
		"%7Dx":                 13737,
	} {
		if got := slot(key); got != want {
			t.Errorf("slot(%q) = %d, want %d", key, got, want)
		}
	}
}
