# modelgate image: `docker build -t modelgate .` then
# `docker run --rm -p 8080:8080 -p 8081:8081 modelgate` serves the demo config.
# Mount your own config directory over /etc/modelgate to run for real.

# --- build -------------------------------------------------------------------------------
FROM rust:1-bookworm AS builder
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src

# Dependencies first, in their own layer, so that a change to src/ does not rebuild them:
# build the locked dependency tree against stub sources. (Plain layers rather than BuildKit
# cache mounts, so the legacy builder works too.) The stub build is only a cache warmer: if
# the manifest names targets the stubs lack, it is skipped and the real build reports.
COPY Cargo.toml Cargo.lock ./
COPY .cargo .cargo
RUN mkdir -p src benches \
 && echo 'fn main() {}' > src/main.rs \
 && for b in $(grep -A1 '^\[\[bench\]\]' Cargo.toml | sed -n 's/^name = "\(.*\)"$/\1/p'); do echo 'fn main() {}' > benches/$b.rs; done \
 && touch src/lib.rs \
 && (cargo build --release --locked || echo "dependency pre-build skipped") \
 && rm -rf src benches

COPY . .
# touch: the copied sources may be older than the stubs, and cargo compares mtimes.
RUN touch src/main.rs src/lib.rs \
 && cargo build --release --locked \
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
