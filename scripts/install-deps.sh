#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build (and, with --test, to test) modelgate.
# Idempotent: does nothing that is already done.
#   scripts/install-deps.sh          cmake (pingora's zlib-ng build needs it)
#   scripts/install-deps.sh --test   also Debian's chromium (browser tests), postgresql and
#                                    redis-server (the fleet tests start their own servers in
#                                    temp dirs), tests/node's npm packages, .venv with
#                                    tests/sdk/requirements.txt, .venv-aider with aider and
#                                    mdbook (the book's build), by cargo install
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WITH_TEST=0
for arg in "$@"; do
  case "$arg" in
    --test) WITH_TEST=1 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "install-deps: unknown option: $arg" >&2; exit 2 ;;
  esac
done

as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "install-deps: need root (or sudo) to run: $*" >&2
    return 1
  fi
}

if ! command -v cmake >/dev/null 2>&1; then
  echo "install-deps: installing cmake" >&2
  as_root apt-get update
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends cmake
fi

if [ "$WITH_TEST" -eq 1 ] && ! command -v chromium >/dev/null 2>&1; then
  echo "install-deps: installing chromium (headless, for the page tests)" >&2
  as_root apt-get update
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium
fi

if [ "$WITH_TEST" -eq 1 ]; then
  missing=()
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "install-deps: installing ${missing[*]} (the tests start their own servers)" >&2
    as_root apt-get update
    # Debian's packages start a system-wide server where they can; the tests never use it.
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
  fi
fi

# A venv at $1 with the requirements file $2, remade only when that file changed.
venv_with() {
  local venv="$1" req="$2" stamp="$1/.requirements.sha256" want
  if [ ! -x "$venv/bin/python" ]; then
    if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
      echo "install-deps: installing python3-venv" >&2  # Debian's python3 ships venv apart
      as_root apt-get update
      as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-venv
    fi
    echo "install-deps: creating $venv" >&2
    python3 -m venv "$venv"
  fi
  want="$(sha256sum "$req" | cut -d' ' -f1)"
  if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    echo "install-deps: pip install -r ${req#"$ROOT/"} into ${venv#"$ROOT/"}" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
    echo "$want" > "$stamp"
  fi
}

if [ "$WITH_TEST" -eq 1 ]; then
  venv_with "$ROOT/.venv" "$ROOT/tests/sdk/requirements.txt"
  # aider pins its own openai and litellm: a venv of its own.
  venv_with "$ROOT/.venv-aider" "$ROOT/tests/sdk/requirements-aider.txt"
  # The official Node clients (tests/node), Node 22 among them (the `node` package: what these
  # SDKs need, from the npm registry, whatever Node the machine has to run npm).
  NODE_STAMP="$ROOT/tests/node/node_modules/.lock.sha256"
  want="$(sha256sum "$ROOT/tests/node/package-lock.json" | cut -d' ' -f1)"
  if [ "$(cat "$NODE_STAMP" 2>/dev/null || true)" != "$want" ]; then
    if ! command -v npm >/dev/null 2>&1; then
      echo "install-deps: installing npm" >&2
      as_root apt-get update
      as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends npm
    fi
    echo "install-deps: npm ci in tests/node" >&2
    (cd "$ROOT/tests/node" && npm ci --no-audit --no-fund --loglevel=error)
    echo "$want" > "$NODE_STAMP"
  fi
fi

if [ "$WITH_TEST" -eq 1 ] && ! command -v mdbook >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/mdbook" ]; then
  echo "install-deps: cargo install --locked mdbook (a few minutes, once)" >&2
  cargo install --locked --quiet mdbook --version "^0.5"
fi
