package rlqs

import (
	"encoding/binary"
	"fmt"
	"sort"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/sluice-rl/sluice/rules"
)

// Bounds of one bucket id.
const (
	maxBucketFields = 32
	maxFieldKey     = 256
	maxFieldValue   = 4096
	maxBucketBytes  = 4096 // the keys and values together
)

// canonical names a bucket id whatever the order its map was sent in: its
// fields sorted by key, each key and value length-prefixed, so that no two
// ids share a name. It also returns the fields in that order, as the
// descriptor the rules match.
func canonical(domain string, id *rlqsv3.BucketId) (string, []rules.EnvoyEntry, error) {
	fields := id.GetBucket()
	if len(fields) == 0 {
		return "", nil, fmt.Errorf("bucket_id has no fields")
	}
	if len(fields) > maxBucketFields {
		return "", nil, fmt.Errorf("bucket_id has %d fields, at most %d are taken", len(fields), maxBucketFields)
	}
	entries := make([]rules.EnvoyEntry, 0, len(fields))
	size := 0
	for k, v := range fields {
		size += len(k) + len(v)
		switch {
		case k == "":
			return "", nil, fmt.Errorf("bucket_id has a field with an empty key")
		case len(k) > maxFieldKey:
			return "", nil, fmt.Errorf("bucket_id has a key of %d bytes, at most %d are taken", len(k), maxFieldKey)
		case len(v) > maxFieldValue:
			return "", nil, fmt.Errorf("bucket_id[%q] is %d bytes, at most %d are taken", k, len(v), maxFieldValue)
		}
		entries = append(entries, rules.EnvoyEntry{Key: k, Value: v})
	}
	if size > maxBucketBytes {
		return "", nil, fmt.Errorf("bucket_id is %d bytes of keys and values, at most %d are taken", size, maxBucketBytes)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Key < entries[j].Key })
	b := binary.AppendUvarint(nil, uint64(len(domain)))
	b = append(b, domain...)
	for _, e := range entries {
		b = binary.AppendUvarint(b, uint64(len(e.Key)))
		b = append(b, e.Key...)
		b = binary.AppendUvarint(b, uint64(len(e.Value)))
		b = append(b, e.Value...)
	}
	return string(b), entries, nil
}
