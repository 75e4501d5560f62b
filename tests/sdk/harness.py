"""The gateway under test for the Python suites (official SDKs, browser): one real modelgate
binary started from a temp config on free loopback ports, with its in-process mock upstream,
the demo models and a keys file covering each kind of key the tests need."""

import base64
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[2]

# What the mock upstream says: its first 8 words, space-separated (see src/mock_upstream.rs).
MOCK_REPLY = "Hello from the mock café naïve ✓ 日本語"
MOCK_REPLY_TOKENS = 8

# name -> upstream_model (None: sent upstream unchanged).
MODELS = {
    "echo-1": None,
    "demo-large": "echo-1",
    "text-embedding-demo": None,
    "moderation-demo": None,
    "image-demo": None,
    "whisper-demo": None,
    "tts-demo": None,
}

# Every id `/v1/models` lists, in config order: the above, then the concrete names of the
# translated pools' entries (their globs are not listed).
LISTED = [*MODELS, "claude-sonnet-4-5"]

FULL_KEY = "sk-sdk-test-full-0000000000000000"
ECHO_ONLY_KEY = "sk-sdk-test-echo-only-000000000000"
MODELS_ONLY_KEY = "sk-sdk-test-models-only-0000000000"
DISABLED_KEY = "sk-sdk-test-disabled-0000000000000"
UNKNOWN_KEY = "sk-sdk-test-nobody-knows-this-key"
RATE_KEY = "sk-sdk-test-rate-limited-00000000"
PAGE_KEY = "sk-sdk-test-usage-page-0000000000"
GUIDE_RATE_KEY = "sk-sdk-test-client-guide-rpm-1-000"
CONSOLE_USER = "admin"
CONSOLE_PASSWORD = "console password for the tests"

KEYS_TOML = f"""
[[keys]]
id = "full"
secret = "{FULL_KEY}"

[[keys]]
id = "echo-only"
secret = "{ECHO_ONLY_KEY}"
models = ["echo-*"]

[[keys]]
id = "models-only"
secret = "{MODELS_ONLY_KEY}"
endpoints = ["models"]

[[keys]]
id = "disabled"
secret = "{DISABLED_KEY}"
disabled = true

[[keys]]
id = "rate-limited"
secret = "{RATE_KEY}"
rpm = 2

[[keys]]
id = "client-guide-rpm-1"
secret = "{GUIDE_RATE_KEY}"
rpm = 1

[[keys]]
id = "page"
secret = "{PAGE_KEY}"
budget = 50.0
rpm = 600
tpm = 100000
"""

# Where the browser tests write their screenshots: target/screenshots, or the book's images
# when scripts/screenshots.sh refreshes them.
SCREENSHOTS = Path(os.environ.get("MODELGATE_SCREENSHOTS") or REPO_ROOT / "target" / "screenshots")


def screenshot_path(name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS / name

STARTUP_DEADLINE_S = 30


# ---------------------------------------------------------------------------------------
# The gateway process
# ---------------------------------------------------------------------------------------


@dataclass
class Gateway:
    process: subprocess.Popen
    ports: dict  # main, direct, admin, mock -> port
    stderr_path: Path
    scheme: str = "http"
    # Sockets holding ports this process picked (the demo mock's), for the gateway's life.
    held: list = field(default_factory=list)

    def base_url(self, listener: str) -> str:
        return f"{self.scheme}://127.0.0.1:{self.ports[listener]}/v1"

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-8000:]


def hold_port() -> tuple:
    """(port, socket): a loopback port the system picked, held by a socket bound to it with
    SO_REUSEPORT and never listening, so no other process gets it while the gateway's demo
    mock (which binds with SO_REUSEPORT) takes it over."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1], s


def said_ports(stderr_path: Path):
    """The ports the gateway's `listening: main=… direct=… admin=…` line names, or None yet."""
    for line in stderr_path.read_text(errors="replace").splitlines():
        if line.startswith("listening: "):
            words = dict(w.split("=", 1) for w in line.split()[1:] if "=" in w)
            return {name: int(addr.rsplit(":", 1)[1]) for name, addr in words.items()}
    return None


def free_ports(n: int) -> list:
    """n distinct free loopback ports: bind port 0, read the port, close (all at the end)."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def make_certificate(workdir: Path) -> dict:
    """A private CA and a server certificate for 127.0.0.1 and localhost signed by it, made with
    the openssl command: {"ca", "cert", "key"} -> path."""
    def run(*args):
        subprocess.run(["openssl", *args], cwd=workdir, check=True, capture_output=True)
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "ca-key.pem", "-out", "ca.pem", "-days", "2", "-subj", "/CN=modelgate SDK test CA")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "key.pem", "-out", "server.csr", "-subj", "/CN=localhost")
    (workdir / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
        "-CAcreateserial", "-out", "cert.pem", "-days", "2", "-extfile", "san.ext")
    return {name: workdir / f"{name}.pem" for name in ("ca", "cert", "key")}


def tls_config(tls: dict) -> str:
    return "".join(
        f'\n[listeners.tls.{listener}]\ncert = "{tls["cert"]}"\nkey = "{tls["key"]}"\n'
        for listener in ("main", "direct")
    )


def gateway_config(ports: dict) -> str:
    models = "".join(
        f'\n[[models]]\nname = "{name}"\npool = "local"\n'
        + (f'upstream_model = "{upstream}"\n' if upstream else "")
        for name, upstream in MODELS.items()
    )
    return f"""
[listeners]
main = "127.0.0.1:{ports['main']}"
direct = "127.0.0.1:{ports['direct']}"
admin = "127.0.0.1:{ports['admin']}"

[keys]
file = "keys.toml"

[storage]
sqlite = "usage.db"

[console]
user = "{CONSOLE_USER}"
password = "env:MG_SDK_CONSOLE_PASSWORD"

[limits]
# One address runs every suite, wrong keys included: the throttle is tested in tests/*.rs.
auth_failures_per_minute = 1000
[demo]
mock_upstream = "127.0.0.1:{ports['mock']}"

[cors]
allow_origins = ["http://127.0.0.1:{ports['app']}"]

[[pools]]
pass_headers = ["x-mock-*"]
name = "local"
upstreams = ["http://127.0.0.1:{ports['mock']}"]
{models}
# The mock's Anthropic Messages API: requests in other APIs arrive translated.
[[pools]]
pass_headers = ["x-mock-*"]
name = "anthropic"
provider = "anthropic"
api_key = "sk-ant-mock-credential"
upstreams = ["http://127.0.0.1:{ports['mock']}"]

[[models]]
name = "claude-*"
pool = "anthropic"
price = {{ prompt = 3.0, completion = 15.0, cached_prompt = 0.3, cache_write = 3.75 }}

# The same provider for clients that always send sampling parameters (aider): left out.
[[pools]]
pass_headers = ["x-mock-*"]
name = "anthropic-lenient"
provider = "anthropic"
drop_params = ["temperature", "top_p"]
api_key = "sk-ant-mock-credential"
upstreams = ["http://127.0.0.1:{ports['mock']}"]

[[models]]
name = "claude-sonnet-4-5"
pool = "anthropic-lenient"
price = {{ prompt = 3.0, completion = 15.0 }}

# The mock's Chat Completions only: Messages requests arrive translated.
[[pools]]
pass_headers = ["x-mock-*"]
name = "chat-only"
native = ["chat"]
api_key = "sk-openai-mock-credential"
upstreams = ["http://127.0.0.1:{ports['mock']}"]

[[models]]
name = "gpt-*"
pool = "chat-only"
price = {{ prompt = 1.25, completion = 10.0, reasoning = 20.0 }}
"""


def http_get(url: str, context=None):
    """(status, headers) of a GET, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return response.status, response.headers
    except urllib.error.HTTPError as e:
        return e.code, e.headers
    except OSError:
        return None


def is_ready(ports: dict, tls=None) -> bool:
    """/healthz says 200, the mock answers, and `main` and `direct` answer a keyless request
    as the gateway does (401 with an x-request-id), not as some other process on the port."""
    health = http_get(f"http://127.0.0.1:{ports['admin']}/healthz")
    mock = http_get(f"http://127.0.0.1:{ports['mock']}/v1/models")
    if not (health and health[0] == 200 and mock and mock[0] == 200):
        return False
    scheme, context = "http", None
    if tls:
        scheme, context = "https", ssl.create_default_context(cafile=str(tls["ca"]))
    for listener in ("main", "direct"):
        answer = http_get(f"{scheme}://127.0.0.1:{ports[listener]}/v1/models", context)
        if not (answer and answer[0] == 401 and answer[1].get("x-request-id")):
            return False
    return True


def stop(process: subprocess.Popen) -> None:
    """SIGTERM (graceful shutdown), then SIGKILL if it takes too long."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


def start_gateway(binary: Path, workdir: Path, tls=None):
    """Starts the gateway and waits until it is ready: its listeners on ports it picks itself
    (port 0; it names them on stderr), its demo mock on a port this process holds
    (`hold_port`), so no port is released for another process to take first. With `tls` (see
    make_certificate), both API listeners speak HTTPS.
    Returns (gateway, None), or (gateway, why) with the process stopped if startup failed."""
    mock, held = hold_port()
    # `app` and `other_app`: two more origins for the CORS test (only `app` is allowed).
    app, other_app = free_ports(2)
    ports = {"main": 0, "direct": 0, "admin": 0, "mock": mock, "app": app, "other_app": other_app}
    config = workdir / "modelgate.toml"
    config.write_text(gateway_config(ports) + (tls_config(tls) if tls else ""))
    (workdir / "keys.toml").write_text(KEYS_TOML)
    stderr_path = workdir / "gateway.stderr"
    with open(stderr_path, "wb") as stderr, open(workdir / "gateway.stdout", "wb") as stdout:
        process = subprocess.Popen(
            [str(binary), "serve", "--config", str(config)],
            cwd=workdir,
            stdout=stdout,
            stderr=stderr,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info"),
                 "MG_SDK_CONSOLE_PASSWORD": CONSOLE_PASSWORD},
        )
    gateway = Gateway(process, ports, stderr_path, "https" if tls else "http", [held])
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return gateway, f"exited with code {process.returncode}"
        said = said_ports(stderr_path)
        if said:
            ports.update(said)
            if is_ready(ports, tls):
                return gateway, None
        time.sleep(0.1)
    stop(process)
    return gateway, f"not ready within {STARTUP_DEADLINE_S} s"


def watch_errors(page) -> list:
    """Collects script errors and CSP refusals of a page. Chromium logs every non-2xx fetch as
    "Failed to load resource"; those are expected in these tests (a refused API call) and left
    out (the pages declare their icon, so no /favicon.ico is fetched)."""
    problems = []
    page.on("console", lambda m: m.type == "error"
            and not m.text.startswith("Failed to load resource") and problems.append(m.text))
    page.on("pageerror", lambda e: problems.append(str(e)))
    return problems
