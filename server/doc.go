// Package server is sluice as a service: a decision API that gateways and
// services call (JSON over HTTP, and forward-auth for nginx, Traefik and
// Caddy), with Prometheus metrics, health checks and admin endpoints. See
// docs/service.md.
package server
