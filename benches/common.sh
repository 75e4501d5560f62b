# Shared by benches/load.sh and benches/profile.sh (sourced): free ports, the gateway's
# benchmark config (auth, an rpm limit, a budget and an allow-list on the key, a priced model, the usage
# record written, the access log off) and the wrk script of a chat request.

KEY=sk-bench-key-000000000000

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Waits up to 10 s for something to listen on 127.0.0.1:$1.
wait_port() {
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return; sleep 0.1; done
}

# Writes modelgate.toml and keys.toml into $1: listeners on ports $2 (main) and $3 (direct),
# one pool of the mock upstream on port $4, and the admin listener (/metrics) on port $5 if
# given.
gateway_config() {
  cat > "$1/modelgate.toml" <<TOML
[listeners]
main = "127.0.0.1:$2"
direct = "127.0.0.1:$3"
${5:+admin = \"127.0.0.1:$5\"}
[keys]
file = "keys.toml"
[server]
threads = 1
grace_period_seconds = 0
[log]
access = "off"
[[pools]]
name = "mock"
upstreams = ["http://127.0.0.1:$4"]
health_interval_ms = 0
keepalive_timeout_ms = 2000
[[models]]
name = "echo-1"
pool = "mock"
price = { prompt = 0.15, completion = 0.6 }
# The same mock spoken to in Anthropic's Messages API: chat requests for it are translated.
[[pools]]
name = "mock-anthropic"
provider = "anthropic"
upstreams = ["http://127.0.0.1:$4"]
health_interval_ms = 0
keepalive_timeout_ms = 2000
[[models]]
name = "claude-bench"
pool = "mock-anthropic"
price = { prompt = 0.15, completion = 0.6 }
TOML
  printf '[[keys]]\nid = "bench"\nsecret = "%s"\nrpm = 100000000\nbudget = 1000000000.0\nmodels = ["echo-*", "claude-bench"]\n' "$KEY" > "$1/keys.toml"
}

# Writes to $1 the wrk script of a chat request, streamed if $2 is true, for model $3 (echo-1).
chat_script() {
  cat > "$1" <<LUA
wrk.method = "POST"
wrk.body = '{"model":"${3:-echo-1}","stream":$2,"messages":[{"role":"user","content":"hello there, how are you"}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $KEY"
LUA
}

# Interleaved rounds against gateways side by side: for plain and streamed chat (scripts
# $TMP/plain.lua and $TMP/stream.lua), a 1 s warm-up each, then ROUNDS rounds of DUR seconds,
# C connections, WRK_THREADS wrk threads on WRK_CPUS, each round visiting the targets named
# (each one's port in $TMP/<name>/port) in turn. Prints "case round name req/s" lines to
# stdout and into $TMP/rounds.txt, then each case's medians and the ratio of every target to
# each one named before it.
ab_rounds() {
  local c r t v
  for c in plain stream; do
    for t in "$@"; do taskset -c "$WRK_CPUS" wrk -t"${WRK_THREADS:-1}" -c"$C" -d1s -s "$TMP/$c.lua" "http://127.0.0.1:$(cat "$TMP/$t/port")/v1/chat/completions" >/dev/null; done
    for r in $(seq "$ROUNDS"); do
      for t in "$@"; do
        v=$(taskset -c "$WRK_CPUS" wrk -t"${WRK_THREADS:-1}" -c"$C" -d"${DUR}s" -s "$TMP/$c.lua" "http://127.0.0.1:$(cat "$TMP/$t/port")/v1/chat/completions" | awk '/Requests\/sec/{print $2}')
        echo "$c $r $t $v"
      done
    done
  done | tee "$TMP/rounds.txt"
  python3 - "$TMP/rounds.txt" "$@" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    c, _, t, v = line.split()
    d[(c, t)].append(float(v))
names = sys.argv[2:]
for c in ("plain", "stream"):
    m = {t: statistics.median(d[(c, t)]) for t in names}
    ratios = [f"{b}/{a} {m[b] / m[a]:.3f}" for i, b in enumerate(names) for a in names[:i]]
    print(f"{c}: " + ", ".join(f"{t} {v:.0f} req/s" for t, v in m.items()) + "; " + ", ".join(ratios))
PY
}
