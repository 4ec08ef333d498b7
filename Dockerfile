# Multi-stage build: a static narwhal binary on a distroless base, run as non-root.
# Base images are pinned by digest, the tag beside it saying what it is: the digest decides which
# image it is, and renewing one is a reviewed commit (docs/security.md, "Deploying").
FROM golang:1.26.8@sha256:6c2a5538f964f1c82f97ad14988bf05de100d922d159d0e398b54c7b0ca0c6c9 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/narwhal ./cmd/narwhal
# An empty directory owned by the non-root user, where a volume of certificates mounts
# (`narwhal certs --dir /etc/narwhal/tls` in the compose examples): a new volume takes its owner.
RUN mkdir -p /out/tls

FROM gcr.io/distroless/static-debian12:nonroot@sha256:d093aa3e30dbadd3efe1310db061a14da60299baff8450a17fe0ccc514a16639
COPY --from=build /out/narwhal /narwhal
COPY --from=build --chown=65532:65532 /out/tls /etc/narwhal/tls
USER 65532:65532
# The durable state (state.dir "" = ~/.local/state/narwhal) goes under the non-root user's home.
WORKDIR /home/nonroot
EXPOSE 9002 18000 9090
ENTRYPOINT ["/narwhal"]
CMD ["serve", "--config", "/etc/narwhal/config.yaml"]
