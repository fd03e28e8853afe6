package rlqs

import (
	"encoding/json"
	"os"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
)

// The Envoy configuration docs/service.md shows is one Envoy accepts as
// far as its API goes (every field known, every type and rule of the
// protos' validation met), and the buckets it builds are the ones the rules
// beside it limit.
func TestTheExampleEnvoyConfigurationIsValidAndMatchesItsRules(t *testing.T) {
	raw, err := os.ReadFile("../examples/envoy/rlqs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var bs bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &bs); err != nil {
		t.Fatalf("examples/envoy/rlqs.yaml is not an Envoy bootstrap: %v", err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("examples/envoy/rlqs.yaml: %v", err)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := bs.StaticResources.Listeners[0].FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	var filter rlqsfilterv3.RateLimitQuotaFilterConfig
	if err := hcm.HttpFilters[0].GetTypedConfig().UnmarshalTo(&filter); err != nil {
		t.Fatal(err)
	}
	if err := filter.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	var settings rlqsfilterv3.RateLimitQuotaBucketSettings
	if err := filter.GetBucketMatchers().GetOnNoMatch().GetAction().GetTypedConfig().UnmarshalTo(&settings); err != nil {
		t.Fatal(err)
	}
	if err := settings.ValidateAll(); err != nil {
		t.Fatal(err)
	}
	// The bucket a request of tenant acme falls in, as the builder makes it.
	bucket := map[string]string{}
	for k, v := range settings.GetBucketIdBuilder().GetBucketIdBuilder() {
		bucket[k] = v.GetStringValue()
		if v.GetCustomValue() != nil {
			bucket[k] = "acme"
		}
	}
	rulesYAML, err := os.ReadFile("../examples/envoy/quota-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	q := newQuotaTest(t, string(rulesYAML), Options{})
	e := q.envoy("example", filter.GetDomain(), bucket)
	e.Report()
	q.settle()
	if tb := e.Strategy().GetTokenBucket(); tb == nil {
		t.Fatalf("the example's bucket %v in domain %q got %v, want a token bucket of the rule", bucket, filter.GetDomain(), e.Strategy())
	}
}
