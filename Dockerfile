# modelgate image: `docker build -t modelgate .` then
# `docker run --rm -p 8080:8080 -p 8081:8081 modelgate` serves the demo config.
# Mount your own config directory over /etc/modelgate to run for real.

# --- build -------------------------------------------------------------------------------
FROM rust:1-bookworm AS builder
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src

COPY . .
# Cache mounts keep downloaded crates and compiled dependencies between builds, so a change
# to src/ recompiles only modelgate. Cache mounts are not part of the image: copy the binary out.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
 && install -D -m 0755 target/release/modelgate /out/modelgate

# --- run ---------------------------------------------------------------------------------
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/modelgate --shell /usr/sbin/nologin modelgate \
 && install -d -o modelgate -g modelgate /var/lib/modelgate

COPY --from=builder /out/modelgate /usr/local/bin/modelgate
COPY --chown=modelgate:modelgate conf/ /etc/modelgate/
# The demo config keeps usage records in ../data (relative to conf/); in the image they go
# to /var/lib/modelgate. The config directory belongs to the service user because the
# console edits the keys file in place (write to a temp file, then rename).
RUN sed -i 's|^\(sqlite *= *\)"[^"]*"|\1"/var/lib/modelgate/usage.db"|' /etc/modelgate/modelgate.toml \
 && grep -q '^sqlite *= *"/var/lib/modelgate/usage.db"' /etc/modelgate/modelgate.toml \
 && /usr/local/bin/modelgate check --config /etc/modelgate/modelgate.toml

USER modelgate
WORKDIR /var/lib/modelgate
EXPOSE 8080 8081 9090
ENTRYPOINT ["modelgate"]
CMD ["serve", "--config", "/etc/modelgate/modelgate.toml"]
