package redis

import "testing"

// Reference slots from the Redis Cluster specification and redis-cli
// CLUSTER KEYSLOT.
func TestSlotMatchesRedisCluster(t *testing.T) {
	for key, want := range map[string]uint16{
		"123456789":            12739, // the CRC16 check value 0x31C3, mod 16384
		"foo":                  12182,
		"{user1000}.following": slot("user1000"),
		"foo{}{bar}":           slot("foo{}{bar}"), // an empty first tag hashes the whole key
		"{a}b":                 slot("a"),
	} {
		if got := slot(key); got != want {
			t.Errorf("slot(%q) = %d, want %d", key, got, want)
		}
	}
}
