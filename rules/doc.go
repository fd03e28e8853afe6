// Package rules is sluice's configuration: rules that say whose requests
// count (the key), which requests they apply to (the match) and how many may
// pass (the limit), loaded from YAML or JSON and validated with the file,
// line, column and field of every fault.
//
// A rule file, by example:
//
//	keys:                      # named key sources (these four are defaults)
//	  user:    {header: X-User-ID}
//	  tenant:  {header: X-Tenant-ID}
//	  api_key: {header: Authorization, scheme: Bearer, hash: true}
//	  phone:   {body: phone}
//	trustedProxies: [10.0.0.0/8]
//	ipv6Prefix: 64
//	rules:
//	  - id: login
//	    match: {method: POST, path: /login}
//	    key: [user, ip]
//	    rate: 10
//	    per: 15m
//	    algorithm: sliding-log
//	    countOn: {status: [401, 403]}
//	    penalty: {after: 10, block: 15m}
//
// Key sources: the built-ins ip (the client address, IPv6 aggregated to
// ipv6Prefix bits), route (method and matched pattern), method, path and
// host; inline header:NAME, query:NAME and cookie:NAME; and the named sources
// of keys. A key made of several sources joins their values unambiguously.
// Sources marked hash (api_key by default) are replaced by a SHA-256 digest
// before use, so secrets never reach a store, a log or a metric.
//
// Path patterns: segments separated by "/"; "{name}" matches exactly one
// non-empty segment; "*" matches one segment, or, as the last segment, any
// number of remaining segments (including none).
package rules
