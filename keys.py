"""API keys: where they come from, what each is called, and how a presented key is
matched.

Keys come from `--api-key` (repeatable, comma-separated, `LLAMA_API_KEY`) and from the
keys file (`--api-key-file`), all combined. The file holds one key a line:

    # comments and blank lines are ignored
    alice:sk-alice-key                      a named key
    sk-anonymous-key                        a key known by its hash (`key_name`)
    bob:sk-bob-key rpm=60 tpm=40000 daily=1000000
    carol:sk-carol-key webhook_url=https://hooks.example/carol webhook_secret=whsec_...
    ops:sk-ops-key admin=true               a key that may also load and unload models

Every key has a name (its tenant); a key given without one is known by a short hash of
it. Names are unique. The key itself is never kept: an entry holds its SHA-256 digest,
so no entry can leak a key into a log or an error. Errors name the file and the line,
never a key.

A key may have its own webhook (`webhook_url=` with `webhook_secret=`): the ends of its
background responses are announced there instead of at `--webhook-url` (`mlxcel.webhooks`).

An admin key (`admin=true` in the file, or `--admin-key`) may also load and unload models;
on a server with keys, no other key may (a reload costs every tenant seconds).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mlxcel.errors import ConfigError
from mlxcel.webhooks import WebhookTarget, parse_target

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_KEY = re.compile(r"[\x21-\x7e]+")
_COUNT = re.compile(r"[0-9]{1,18}")
"""A limit: ASCII digits only (`str.isdigit` also takes digits `int` refuses, such as
'²'), and few enough that `int` never meets its length limit."""
"""A key is printable ASCII without spaces: an HTTP header carries nothing else safely."""
LIMIT_NAMES = ("rpm", "tpm", "daily")
WEBHOOK_OPTIONS = ("webhook_url", "webhook_secret")
ADMIN_OPTION = "admin"
_SWITCH = {"true": True, "false": False}


def key_name(key: str) -> str:
    """How a key without a name is known (logs, tenancy): a short hash, never the key."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """The limits of one key: requests a minute, tokens (input + output) a minute and
    tokens a UTC day. None leaves a limit to the server-wide setting; 0 turns it off."""

    rpm: int | None = None
    tpm: int | None = None
    daily: int | None = None

    def over(self, defaults: KeyLimits) -> KeyLimits:
        """These limits, with `defaults`' where these leave one unset."""
        return KeyLimits(
            defaults.rpm if self.rpm is None else self.rpm,
            defaults.tpm if self.tpm is None else self.tpm,
            defaults.daily if self.daily is None else self.daily,
        )

    @property
    def active(self) -> bool:
        return any((self.rpm, self.tpm, self.daily))


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One accepted key: its name (the tenant), its own limits, and its digest."""

    name: str
    limits: KeyLimits = KeyLimits()
    digest: bytes = field(default=b"", repr=False, compare=False)
    """SHA-256 of the key: what a presented key's digest is compared with."""
    webhook: WebhookTarget | None = None
    """Where the ends of this key's background responses are announced, when its own."""
    admin: bool = False
    """It may load and unload models (`--admin-key`, or `admin=true` in the keys file)."""

    @classmethod
    def of(
        cls,
        key: str,
        name: str | None = None,
        limits: KeyLimits = KeyLimits(),
        webhook: WebhookTarget | None = None,
        *,
        admin: bool = False,
    ) -> ApiKey:
        digest = _digest(key.encode("ascii"))
        return cls(name or key_name(key), limits, digest, webhook, admin)


def _digest(secret: bytes) -> bytes:
    return hashlib.sha256(secret).digest()


def flag_keys(values: Iterable[str], *, admin: bool = False) -> tuple[ApiKey, ...]:
    """The keys of `--api-key` values (each comma-separated), unnamed; of `--admin-key`
    values with `admin`."""
    flag = "--admin-key" if admin else "--api-key"
    keys: list[ApiKey] = []
    for value in values:
        for raw in value.split(","):
            key = raw.strip()
            if not key:
                continue
            if _KEY.fullmatch(key) is None:
                raise ConfigError(f"{flag}: a key must be printable ASCII without spaces")
            keys.append(ApiKey.of(key, admin=admin))
    return tuple(keys)


def parse_key_file(text: str, source: str) -> tuple[ApiKey, ...]:
    """The keys of a keys file's text; `source` names it in errors."""
    keys: list[ApiKey] = []
    names: dict[str, int] = {}
    digests: dict[bytes, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        where = f"{source} line {number}"
        name, sep, key = words[0].partition(":")
        if not sep:
            name, key = "", words[0]
        elif _NAME.fullmatch(name) is None:
            raise ConfigError(
                f"{where}: a key's name is 1 to 64 letters, digits, '.', '_' or '-', "
                "beginning with a letter or digit"
            )
        if _KEY.fullmatch(key) is None:
            raise ConfigError(f"{where}: no key after the name")
        limits, webhook, admin = _options(words[1:], where)
        entry = ApiKey.of(key, name or None, limits, webhook, admin=admin)
        if entry.digest in digests:
            raise ConfigError(f"{where}: the same key as on line {digests[entry.digest]}")
        if entry.name in names:
            raise ConfigError(
                f"{where}: the name {entry.name} is taken by line {names[entry.name]}; "
                "names must be unique"
            )
        names[entry.name] = digests[entry.digest] = number
        keys.append(entry)
    return tuple(keys)


def _options(words: list[str], where: str) -> tuple[KeyLimits, WebhookTarget | None, bool]:
    # A word that is not an option is not echoed: it could be part of a key.
    values: dict[str, int] = {}
    texts: dict[str, str] = {}
    for word in words:
        if word.startswith("#"):
            break
        option, sep, value = word.partition("=")
        if not sep or option not in (*LIMIT_NAMES, *WEBHOOK_OPTIONS, ADMIN_OPTION):
            raise ConfigError(
                f"{where}: after the key only rpm=N, tpm=N, daily=N, webhook_url=URL, "
                "webhook_secret=whsec_... and admin=true may follow"
            )
        if option in values or option in texts:
            raise ConfigError(f"{where}: {option} is given twice")
        if option in (*WEBHOOK_OPTIONS, ADMIN_OPTION):
            texts[option] = value
        elif _COUNT.fullmatch(value) is None:  # 0 turns that limit off for this key
            raise ConfigError(f"{where}: {option} must be a whole number (0: no limit)")
        else:
            values[option] = int(value)
    admin = _SWITCH.get(texts.get(ADMIN_OPTION, "false"))
    if admin is None:
        raise ConfigError(f"{where}: admin must be true or false")
    webhook = parse_target(texts.get("webhook_url"), texts.get("webhook_secret"), where)
    return KeyLimits(**values), webhook, admin


def read_key_file(path: Path) -> tuple[ApiKey, ...]:
    """The keys of the file at `path`; ConfigError if it cannot be read or parsed. A
    byte-order mark (an editor's UTF-8 with BOM) is no part of the first line, and CRLF
    line ends are line ends."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise ConfigError(f"--api-key-file {path}: cannot be read ({reason})") from None
    return parse_key_file(text, f"--api-key-file {path}")


def combine(*sources: Iterable[ApiKey]) -> tuple[ApiKey, ...]:
    """Every source's keys as one keyring's entries; two with one name, or one key given
    twice, are a ConfigError."""
    entries: list[ApiKey] = []
    names: set[str] = set()
    digests: dict[bytes, str] = {}
    for source in sources:
        for entry in source:
            if entry.digest in digests:
                raise ConfigError(
                    f"the API key named {entry.name} is the same key as {digests[entry.digest]} "
                    "(given by --api-key, LLAMA_API_KEY, --admin-key or --api-key-file)"
                )
            if entry.name in names:
                raise ConfigError(
                    f"two API keys are named {entry.name} (given by --api-key, LLAMA_API_KEY, "
                    "--admin-key or --api-key-file); names must be unique"
                )
            names.add(entry.name)
            digests[entry.digest] = entry.name
            entries.append(entry)
    return tuple(entries)


class Keyring:
    """The keys a server accepts: the fixed ones (flags, environment) and the keys file's,
    which `reload` reads again (on SIGHUP).

    A keyring without keys and without a keys file accepts every request (one tenant);
    one with a keys file requires a key even while the file holds none, so emptying the
    file never opens the server."""

    def __init__(self, fixed: tuple[ApiKey, ...] = (), path: Path | None = None) -> None:
        self._fixed = combine(fixed)
        self.path = path
        self._entries = combine(self._fixed, read_key_file(path) if path else ())

    @classmethod
    def load(cls, keys: Iterable[str], path: Path | None, admin: Iterable[str] = ()) -> Keyring:
        """The keyring of `--api-key` values, `--admin-key` values (`admin`) and the keys
        file; ConfigError if a key or the file is wrong."""
        return cls(flag_keys(keys) + flag_keys(admin, admin=True), path)

    @property
    def entries(self) -> tuple[ApiKey, ...]:
        return self._entries

    def __bool__(self) -> bool:
        """Whether requests must carry a key."""
        return bool(self._fixed) or self.path is not None

    def reload(self) -> tuple[ApiKey, ...]:
        """Read the keys file again; its keys replace the file's old ones, the fixed keys
        stay. On ConfigError (unreadable, unparsable, a duplicate) nothing changes."""
        if self.path is None:
            return self._entries
        # Swapped in one assignment: a request matched meanwhile sees old or new, whole.
        self._entries = combine(self._fixed, read_key_file(self.path))
        return self._entries

    def limits_of(self, name: str) -> KeyLimits | None:
        """The limits the key named `name` has of its own (the keys file's `rpm=`,
        `tpm=`, `daily=`), or None when it has none or no longer exists; read from the
        keys as they are now, so a SIGHUP's new limits apply at once."""
        for entry in self._entries:
            if entry.name == name:
                return entry.limits
        return None

    def webhook_of(self, name: str) -> WebhookTarget | None:
        """The webhook the key named `name` has of its own, as the keys are now."""
        for entry in self._entries:
            if entry.name == name:
                return entry.webhook
        return None

    def match(self, presented: bytes) -> ApiKey | None:
        """The entry of the presented key, or None. Every entry's digest is compared, in
        constant time, with the digest of the key presented, so the time taken says
        nothing about which key (or how much of one) matched."""
        digest = _digest(presented)
        found: ApiKey | None = None
        for entry in self._entries:
            if hmac.compare_digest(digest, entry.digest):
                found = entry
        return found
