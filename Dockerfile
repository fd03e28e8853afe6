# The sluice image: the static binary and CA certificates on an empty base,
# run as an unprivileged user. It is built from a context that holds the
# two files, so that no base image is pulled:
#
#   CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$(git describe --tags --always)" -o ctx/sluice ./cmd/sluice
#   cp /etc/ssl/certs/ca-certificates.crt ctx/
#   buildah bud -f Dockerfile -t sluice ctx      # or: docker build -f Dockerfile ctx
#
# (internal/e2e/image builds it so and runs it.) With a registry at hand,
# docs/operations.md shows the multi-stage variant that builds the binary in
# a golang image.
FROM scratch
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY sluice /usr/local/bin/sluice
# So that `sluice probe ...` (a Kubernetes exec probe) finds it.
ENV PATH=/usr/local/bin
# nobody:nogroup in distroless images; no shell, no package manager.
USER 65532:65532
# The decision API and /metrics; Envoy's rate limit service (gRPC).
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/sluice"]
# A rule file mounted at /etc/sluice/rules.yaml. The listeners take every
# address, as a container's must to be reached; the admin endpoints then
# need --admin-token (they are refused without one).
CMD ["serve", "--config", "/etc/sluice/rules.yaml", "--listen", ":8080", "--grpc-listen", ":8081"]
HEALTHCHECK --interval=10s --timeout=3s CMD ["/usr/local/bin/sluice", "probe", "http://127.0.0.1:8080/readyz"]
