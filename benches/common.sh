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

# A gateway's CPU time so far, in µs: all threads, of it in the kernel, of it the usage
# writer's thread (its batches, the journal's syncs); then its context switches (voluntary,
# involuntary): "cpu sys writer vol invol" for the pid in $1.
proc_counters() {
  local hz; hz=$(getconf CLK_TCK)
  awk -v hz="$hz" '{ printf "%s %s ", ($14 + $15) * 1000000 / hz, $15 * 1000000 / hz }' "/proc/$1/stat"
  cat /proc/"$1"/task/*/stat 2>/dev/null | awk -v hz="$hz" '$2 == "(usage-writer)" { w += ($14 + $15) } END { printf "%s ", w * 1000000 / hz }'
  cat /proc/"$1"/task/*/status | awk '/^voluntary_ctxt_switches/ { v += $2 } /^nonvoluntary_ctxt_switches/ { n += $2 } END { print v, n }'
}

# Interleaved rounds against gateways side by side: for plain and streamed chat (scripts
# $TMP/plain.lua and $TMP/stream.lua), a 1 s warm-up each, then ROUNDS rounds of DUR seconds,
# C connections, WRK_THREADS wrk threads on WRK_CPUS, each round visiting the targets named
# (each one's port in $TMP/<name>/port) in turn, starting one later each round. Prints "case
# round name req/s" lines to stdout and into $TMP/rounds.txt (with, where $TMP/<name>/pid
# names the gateway's process, its CPU µs (all, kernel, usage writer), voluntary and
# involuntary context switches a request in that round), then each case's medians and the ratio of every target to each one
# named before it: a gateway that serves less at the same CPU a request waits on something
# (its CPU is not saturated); one whose CPU a request rose does more.
ab_rounds() {
  local c r t v out before after n
  for c in plain stream; do
    for t in "$@"; do taskset -c "$WRK_CPUS" wrk -t"${WRK_THREADS:-1}" -c"$C" -d1s -s "$TMP/$c.lua" "http://127.0.0.1:$(cat "$TMP/$t/port")/v1/chat/completions" >/dev/null; done
    for r in $(seq "$ROUNDS"); do
      # Each round starts one target later: none is always the one measured after another.
      local order=("$@") k=$(( (r - 1) % $# ))
      order=("${order[@]:k}" "${order[@]:0:k}")
      for t in "${order[@]}"; do
        before=""; [ -f "$TMP/$t/pid" ] && before=$(proc_counters "$(cat "$TMP/$t/pid")")
        out=$(taskset -c "$WRK_CPUS" wrk -t"${WRK_THREADS:-1}" -c"$C" -d"${DUR}s" -s "$TMP/$c.lua" "http://127.0.0.1:$(cat "$TMP/$t/port")/v1/chat/completions")
        v=$(awk '/Requests\/sec/{print $2}' <<<"$out")
        if [ -n "$before" ]; then
          after=$(proc_counters "$(cat "$TMP/$t/pid")")
          n=$(awk '/requests in/{print $1}' <<<"$out")
          echo "$c $r $t $v $(awk -v n="$n" -v b="$before" -v a="$after" 'BEGIN { split(b, x, " "); split(a, y, " "); printf "%.1f %.1f %.1f %.3f %.3f", (y[1]-x[1])/n, (y[2]-x[2])/n, (y[3]-x[3])/n, (y[4]-x[4])/n, (y[5]-x[5])/n }')"
        else
          echo "$c $r $t $v"
        fi
      done
    done
  done | tee "$TMP/rounds.txt"
  python3 - "$TMP/rounds.txt" "$@" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
per = collections.defaultdict(list)
# Each round's figures, for its ratios: a machine whose speed drifts over minutes moves a
# round's targets together, so the median of the rounds' own ratios cancels the drift that the
# ratio of medians keeps.
by_round = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    c, r, t, v, *counters = line.split()
    by_round[(c, r)][t] = float(v)
    d[(c, t)].append(float(v))
    if counters:
        per[(c, t)].append([float(x) for x in counters])
names = sys.argv[2:]
for c in ("plain", "stream"):
    m = {t: statistics.median(d[(c, t)]) for t in names}
    ratios = [f"{b}/{a} {m[b] / m[a]:.3f}" for i, b in enumerate(names) for a in names[:i]]
    print(f"{c}: " + ", ".join(f"{t} {v:.0f} req/s" for t, v in m.items()) + "; " + ", ".join(ratios))
    rounds = [v for (cc, _), v in by_round.items() if cc == c]
    paired = [f"{b}/{a} {statistics.median(x[b] / x[a] for x in rounds):.3f}"
              for i, b in enumerate(names) for a in names[:i]]
    print(f"  {c} paired (median of each round's ratio): " + ", ".join(paired))
    for t in names:
        if per[(c, t)]:
            cpu, sys_, writer, vol, invol = (statistics.median(x[i] for x in per[(c, t)]) for i in range(5))
            print(f"  {c} {t}: {cpu:.1f} µs CPU ({sys_:.1f} in the kernel, {writer:.1f} the usage "
                  f"writer's), {vol:.3f} voluntary and {invol:.3f} involuntary context switches "
                  f"a request (medians)")
PY
}
