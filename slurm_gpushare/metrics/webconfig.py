"""The exporter's web configuration file (``--web.config.file``): TLS, client certificates, basic auth.

The format is Prometheus' exporter-toolkit's (node_exporter and most
exporters read the same file), so one file and one habit serve every
exporter of a site::

    tls_server_config:
      cert_file: server.crt            # relative paths: from the file's directory
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: clients-ca.crt
    http_server_config:
      headers: {X-Content-Type-Options: nosniff}
    basic_auth_users:
      prometheus: $2y$10$...           # bcrypt hash: htpasswd -nBC 10 "" | tr -d ':\\n'

What Python's ssl module cannot do as Go's crypto/tls does is refused with a
message, never ignored: client_auth_type RequestClientCert and
RequireAnyClientCert (a certificate asked for but not verified), and the Go
names of cipher_suites and curve_preferences. Every problem of a file is
reported at once, each with its key and what is accepted (``WebConfigError``).

``BasicAuth`` checks an ``Authorization`` header as the toolkit does: bcrypt
runs once per (user, hash, password) and the answer is cached, so a scrape
every few seconds does not cost ~70 ms of CPU each time; an unknown user is
checked against a dummy hash so the answer takes as long as for a known one.
Against clients that guess it is bounded: good logins are cached apart from
failed ones (guesses never evict them), bcrypt runs in a fixed number of
slots and never under a lock (a check that finds none free answers at once),
and a client address that keeps failing is answered 429 for a while.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import ssl
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import PolicyError, Problem

TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
TLS_KEYS = (
    "cert_file",
    "key_file",
    "cert",
    "key",
    "client_ca_file",
    "client_ca",
    "client_auth_type",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "prefer_server_cipher_suites",
)
TLS_UNSUPPORTED = {
    "cipher_suites": "Go cipher suite names are not supported here (Python's ssl takes OpenSSL's own list); "
    "leave it out for OpenSSL's defaults, or restrict versions with min_version",
    "curve_preferences": "Go curve names are not supported here; leave it out for OpenSSL's defaults",
}
HTTP_KEYS = ("http2", "headers")
RATE_KEYS = ("interval", "burst")
# client_auth_type -> ssl verify mode; the toolkit's RequestClientCert and RequireAnyClientCert ask for a
# certificate without verifying it, which Python's ssl cannot do (and the toolkit calls insecure).
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# The headers the toolkit lets a site set, with their allowed values (None: any).
HEADERS = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}
BCRYPT = re.compile(r"^\$2[abxy]?\$(\d\d)\$[./A-Za-z0-9]{53}$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class WebConfigError(PolicyError):
    """A web configuration file that cannot be used; every problem with its key (PolicyError's report)."""


@dataclass(frozen=True)
class TlsConfig:
    cert: str  # PEM text (from cert_file or cert)
    key: str = field(repr=False)  # PEM text (from key_file or key)
    client_ca: str = ""  # PEM text, "" when none
    verify: ssl.VerifyMode = ssl.CERT_NONE
    allowed_sans: tuple[str, ...] = ()
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3
    prefer_server_ciphers: bool = True


@dataclass(frozen=True)
class WebConfig:
    tls: TlsConfig | None
    users: dict[str, str] = field(repr=False)  # user -> bcrypt hash
    headers: dict[str, str]
    rate_interval: float  # seconds between two requests of the token bucket; 0: no limit
    rate_burst: int


def load(path: str | Path) -> WebConfig:
    """Read and check a web configuration file; WebConfigError lists every problem."""
    from ..policy.load import parse_yaml

    path = Path(path)
    source = f"--web.config.file {path}"
    try:
        text = path.read_text()
    except OSError as exc:
        raise WebConfigError(source, [Problem("", f"cannot read it: {exc.strerror or exc}")]) from None
    raw = parse_yaml(text, source)
    if raw is None:
        raw = {}  # an empty file: plain HTTP without auth, as the toolkit reads it
    problems: list[Problem] = []
    config = parse(raw, path.parent, problems)
    if config is not None and not problems and config.tls is not None:
        try:
            ssl_context(config.tls)  # the certificate, key and client CA load together
        except WebConfigError as exc:
            problems += exc.problems
    if config is None or problems:
        raise WebConfigError(source, problems)
    return config


def parse(raw: object, base: Path, problems: list[Problem]) -> WebConfig | None:
    """The checked config of a decoded YAML document (relative files from ``base``); problems appended."""
    top = _section(raw, "", TOP_KEYS, problems)
    tls = _tls(top.get("tls_server_config"), base, problems)
    headers = _http(top.get("http_server_config"), problems)
    users = _users(top.get("basic_auth_users"), problems)
    interval, burst = _rate(top.get("rate_limit"), problems)
    return WebConfig(tls, users, headers, interval, burst)


def _section(
    raw: object, path: str, allowed: tuple[str, ...], problems: list[Problem], unsupported: dict[str, str] | None = None
) -> dict:
    """``raw`` as a mapping; each unknown key is a problem naming the keys accepted there."""
    if raw is None:
        return {}
    where = path or "the file"
    if not isinstance(raw, dict):
        problems.append(Problem(path, f"expected a mapping with keys {', '.join(allowed)}; got {type(raw).__name__}"))
        return {}
    for key in raw:
        if unsupported and key in unsupported:
            problems.append(Problem(_join(path, key), unsupported[key]))
        elif key not in allowed:
            problems.append(Problem(_join(path, str(key)), f"unknown key in {where}; accepted: {', '.join(allowed)}"))
    return {k: v for k, v in raw.items() if k in allowed}


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _tls(raw: object, base: Path, problems: list[Problem]) -> TlsConfig | None:
    sec = _section(raw, "tls_server_config", TLS_KEYS, problems, TLS_UNSUPPORTED)
    if not sec:
        return None
    p = "tls_server_config"
    cert = _pem(sec, "cert", "cert_file", base, problems, required=True)
    key = _pem(sec, "key", "key_file", base, problems, required=True)
    ca = _pem(sec, "client_ca", "client_ca_file", base, problems, required=False)
    auth = sec.get("client_auth_type", "NoClientCert")
    if auth not in CLIENT_AUTH:
        why = (
            " (asks for a certificate without verifying it: not supported)"
            if auth in ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
            else ""
        )
        problems.append(Problem(f"{p}.client_auth_type", f"{auth!r}{why}; accepted: {', '.join(CLIENT_AUTH)}"))
        auth = "NoClientCert"
    if ca and auth == "NoClientCert":
        problems.append(
            Problem(
                f"{p}.client_auth_type",
                "a client CA is configured: set VerifyClientCertIfGiven or RequireAndVerifyClientCert",
            )
        )
    if not ca and auth != "NoClientCert":
        problems.append(
            Problem(
                f"{p}.client_ca_file",
                f"client_auth_type {auth} needs the CA that signs the "
                "clients' certificates (client_ca_file or client_ca)",
            )
        )
    sans = _strings(sec.get("client_allowed_sans", []), f"{p}.client_allowed_sans", problems)
    if sans and auth != "RequireAndVerifyClientCert":
        problems.append(Problem(f"{p}.client_allowed_sans", "needs client_auth_type RequireAndVerifyClientCert"))
    low = _version(sec.get("min_version", "TLS12"), f"{p}.min_version", problems)
    high = _version(sec.get("max_version", "TLS13"), f"{p}.max_version", problems)
    prefer = _bool(sec.get("prefer_server_cipher_suites", True), f"{p}.prefer_server_cipher_suites", problems)
    if low > high:
        problems.append(Problem(f"{p}.min_version", "is above max_version"))
    return TlsConfig(cert, key, ca, CLIENT_AUTH[auth], tuple(sans), low, high, prefer)


def _pem(sec: dict, inline: str, file_key: str, base: Path, problems: list[Problem], *, required: bool) -> str:
    """PEM text from ``<file_key>`` (a path, relative to the config's directory) or ``<inline>``; not both."""
    p = "tls_server_config"
    if inline in sec and file_key in sec:
        problems.append(Problem(f"{p}.{inline}", f"give {inline} or {file_key}, not both"))
        return ""
    if file_key in sec:
        if not isinstance(sec[file_key], str) or not sec[file_key]:
            problems.append(Problem(f"{p}.{file_key}", "expected a file name"))
            return ""
        where = base / sec[file_key]
        try:
            return where.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(Problem(f"{p}.{file_key}", f"cannot read {where}: {getattr(exc, 'strerror', None) or exc}"))
            return ""
    if inline in sec:
        if isinstance(sec[inline], str) and "-----BEGIN" in sec[inline]:
            return sec[inline]
        problems.append(Problem(f"{p}.{inline}", "expected PEM text (-----BEGIN ...)"))
    elif required:
        problems.append(Problem(f"{p}.{file_key}", f"missing: TLS needs {file_key} (or {inline} inline)"))
    return ""


def _strings(value: object, path: str, problems: list[Problem]) -> list[str]:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    problems.append(Problem(path, "expected a list of strings"))
    return []


def _bool(value: object, path: str, problems: list[Problem]) -> bool:
    if isinstance(value, bool):
        return value
    problems.append(Problem(path, f"expected true or false; got {value!r}"))
    return True


def _version(value: object, path: str, problems: list[Problem]) -> ssl.TLSVersion:
    if value in VERSIONS:
        return VERSIONS[value]
    problems.append(Problem(path, f"{value!r}; accepted: {', '.join(VERSIONS)}"))
    return ssl.TLSVersion.TLSv1_2


def _http(raw: object, problems: list[Problem]) -> dict[str, str]:
    sec = _section(raw, "http_server_config", HTTP_KEYS, problems)
    if "http2" in sec:  # accepted for files shared with Go exporters; this server speaks HTTP/1.1
        _bool(sec["http2"], "http_server_config.http2", problems)
    headers = _section(sec.get("headers"), "http_server_config.headers", tuple(HEADERS), problems)
    for name, value in headers.items():
        allowed = HEADERS[name]
        if not isinstance(value, str) or (allowed and value not in allowed):
            accepted = ", ".join(allowed) if allowed else "a string"
            problems.append(Problem(f"http_server_config.headers.{name}", f"{value!r}; accepted: {accepted}"))
    return {k: v for k, v in headers.items() if isinstance(v, str) and v}


def _users(raw: object, problems: list[Problem]) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(Problem("basic_auth_users", "expected a mapping of user name to bcrypt hash"))
        return {}
    users = {}
    for user, hashed in raw.items():
        m = BCRYPT.match(hashed) if isinstance(hashed, str) else None
        if not isinstance(user, str) or not user or ":" in user:
            problems.append(Problem(f"basic_auth_users.{user}", "a user name is a non-empty string without ':'"))
        elif not m or not 4 <= int(m[1]) <= 31:
            problems.append(
                Problem(
                    f"basic_auth_users.{user}",
                    "expected a bcrypt hash ($2y$10$ and 53 characters; "
                    "htpasswd -nBC 10 \"\" | tr -d ':\\n' makes one)",
                )
            )
        else:
            users[user] = hashed
    return users


def _rate(raw: object, problems: list[Problem]) -> tuple[float, int]:
    sec = _section(raw, "rate_limit", RATE_KEYS, problems)
    interval, burst = sec.get("interval", "0s"), sec.get("burst", 0)
    m = _DURATION.match(str(interval)) if isinstance(interval, (str, int)) else None
    seconds = float(m[1]) * _UNIT[m[2]] if m else 0.0
    if not m and interval != 0:
        problems.append(Problem("rate_limit.interval", f"{interval!r}; expected a duration such as 100ms, 1s, 1m"))
    if not isinstance(burst, int) or isinstance(burst, bool) or burst < 0 or (seconds and burst < 1):
        problems.append(Problem("rate_limit.burst", f"{burst!r}; expected a whole number >= 1"))
        burst = 1
    return seconds, burst


# ---- serving ----------------------------------------------------------------------------------------


def ssl_context(tls: TlsConfig, scratch: Path | None = None) -> ssl.SSLContext:
    """The server's SSLContext. The key and certificate go through a private temporary file (ssl loads them
    only from a path), removed at once."""
    import tempfile

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version, ctx.maximum_version = tls.min_version, tls.max_version
    if tls.prefer_server_ciphers:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    fd, name = tempfile.mkstemp(prefix="gpushare-exporter-", suffix=".pem", dir=scratch)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(tls.cert.rstrip("\n") + "\n" + tls.key)
        ctx.load_cert_chain(name)
    except ssl.SSLError as exc:
        raise WebConfigError(
            "--web.config.file",
            [Problem("tls_server_config", f"the certificate and key do not load: {exc.reason or exc}")],
        ) from None
    finally:
        os.unlink(name)
    ctx.verify_mode = tls.verify
    if tls.client_ca:
        try:
            ctx.load_verify_locations(cadata=tls.client_ca)
        except ssl.SSLError as exc:
            raise WebConfigError(
                "--web.config.file",
                [Problem("tls_server_config.client_ca_file", f"not a PEM CA certificate: {exc.reason or exc}")],
            ) from None
    return ctx


def peer_allowed(tls: TlsConfig, peer: dict | None) -> bool:
    """client_allowed_sans: the verified client certificate has one of the listed SANs (any when none listed)."""
    if not tls.allowed_sans:
        return True
    sans = {value for _kind, value in (peer or {}).get("subjectAltName", ())}
    return bool(sans & set(tls.allowed_sans))


class AuthVerdict:
    """What ``BasicAuth.verdict`` answers: OK (let it through), DENIED (401), LIMITED (429: this client failed
    too often lately), BUSY (503: every password check is in use; answered at once, never queued)."""

    OK, DENIED, LIMITED, BUSY = "ok", "denied", "limited", "busy"


class BasicAuth:
    """Checks ``Authorization: Basic`` against bcrypt hashes, bounded against clients that guess.

    - A login bcrypt accepted is cached (the key is an HMAC under a key made at start, so no password is kept
      in the clear) among at most ``size`` good logins: a scraper pays bcrypt once, and a cached login is let
      through without a password check, whatever else is going on.
    - A refused (user, password) is cached apart, among at most ``failed_size``: failed attempts, however
      many, never evict a good login.
    - At most ``workers`` bcrypt checks run at once, and none under a lock: a check that finds every slot in
      use answers BUSY at once (503) rather than queueing behind them.
    - A client address that failed ``ClientFailures.burst`` times lately is answered LIMITED (429) without a
      check, until its bucket refills; its cached good logins still pass.

    ``checkpw(password, hashed)`` is bcrypt's (tests pass a fake one)."""

    def __init__(
        self,
        users: dict[str, str],
        *,
        size: int = 128,
        failed_size: int = 1024,
        workers: int = 2,
        failures: ClientFailures | None = None,
        checkpw=None,
    ):
        import bcrypt

        self._bcrypt = bcrypt
        self._checkpw = checkpw or bcrypt.checkpw
        self.users = dict(users)
        self.size, self.failed_size = size, failed_size
        self.failures = failures or ClientFailures()
        self.bcrypt_runs = 0
        self._secret = os.urandom(32)
        self._good: OrderedDict[bytes, None] = OrderedDict()
        self._bad: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()  # the caches and counters only; never held during a password check
        self._slots = threading.BoundedSemaphore(workers)
        self._dummy: bytes | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.users)

    def check(self, header: str | None, client: str = "") -> bool:
        """True when no users are configured or the header names a user with the right password."""
        return self.verdict(header, client) == AuthVerdict.OK

    def verdict(self, header: str | None, client: str = "") -> str:
        """An ``AuthVerdict`` for one request's ``Authorization`` header from ``client`` (its address)."""
        if not self.users:
            return AuthVerdict.OK
        creds = _credentials(header)
        if creds is None:
            return AuthVerdict.DENIED
        user, password = creds
        hashed, known = self._hash_of(user)
        key = hmac.new(self._secret, b"\0".join((user.encode(), hashed, password)), hashlib.sha256).digest()
        with self._lock:
            if key in self._good:
                self._good.move_to_end(key)
                return AuthVerdict.OK
            refused = key in self._bad
        if self.failures.limited(client):
            return AuthVerdict.LIMITED
        if refused:
            self.failures.failed(client)
            return AuthVerdict.DENIED
        return self._check(key, password, hashed, known, client)

    def _check(self, key: bytes, password: bytes, hashed: bytes, known: bool, client: str) -> str:
        """One bcrypt check in a free slot (BUSY when none), its answer cached in the good or the bad cache."""
        if not self._slots.acquire(blocking=False):
            return AuthVerdict.BUSY
        try:
            good = self._verify(password, hashed) and known
        finally:
            self._slots.release()
        with self._lock:
            cache, bound = (self._good, self.size) if good else (self._bad, self.failed_size)
            cache[key] = None
            while len(cache) > bound:
                cache.popitem(last=False)
        if not good:
            self.failures.failed(client)
        return AuthVerdict.OK if good else AuthVerdict.DENIED

    def _hash_of(self, user: str) -> tuple[bytes, bool]:
        """The user's hash, else a dummy one of the same cost; every name compared in constant time."""
        found = None
        for name, hashed in self.users.items():
            if hmac.compare_digest(name.encode(), user.encode()):
                found = hashed
        if found is not None:
            return found.encode(), True
        if self._dummy is None:  # made once; two threads making it at once both get a usable one
            cost = int(next(iter(self.users.values()))[4:6])
            self._dummy = self._bcrypt.hashpw(os.urandom(16).hex().encode(), self._bcrypt.gensalt(cost))
        return self._dummy, False

    def _verify(self, password: bytes, hashed: bytes) -> bool:
        with self._lock:
            self.bcrypt_runs += 1
        try:
            return self._checkpw(password, hashed)
        except ValueError:  # bcrypt takes at most 72 bytes of password: a longer one never matches
            return False


class ClientFailures:
    """Failed logins per client address: a token bucket of ``burst`` failures, one more every ``interval``
    seconds. At most ``size`` clients are tracked (the least recently failed forgotten first)."""

    def __init__(self, burst: int = 10, interval: float = 6.0, size: int = 4096, clock=None):
        import time

        self.burst, self.interval, self.size = burst, interval, size
        self.clock = clock or time.monotonic
        self._table: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, at)
        self._lock = threading.Lock()

    def _tokens(self, client: str, now: float) -> float:
        tokens, at = self._table.get(client, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) / self.interval)

    def limited(self, client: str) -> bool:
        """True while ``client`` has no failure left to spend."""
        with self._lock:
            return self._tokens(client, self.clock()) < 1

    def failed(self, client: str) -> None:
        with self._lock:
            now = self.clock()
            self._table[client] = (max(0.0, self._tokens(client, now) - 1), now)
            self._table.move_to_end(client)
            while len(self._table) > self.size:
                self._table.popitem(last=False)


def _credentials(header: str | None) -> tuple[str, bytes] | None:
    """(user, password bytes) of an ``Authorization: Basic`` header, else None."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = raw.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


class RateLimit:
    """rate_limit: a token bucket of ``burst`` tokens, one more every ``interval`` seconds (0: no limit)."""

    def __init__(self, interval: float, burst: int, clock=None):
        import time

        self.interval, self.burst = interval, burst
        self.clock = clock or time.monotonic
        self._tokens, self._at = float(burst), self.clock()
        self._lock = threading.Lock()

    def allow(self) -> bool:
        if not self.interval:
            return True
        with self._lock:
            now = self.clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) / self.interval)
            self._at = now
            if self._tokens >= 1:
                self._tokens -= 1
                return True
            return False
