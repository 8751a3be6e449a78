"""The access log: one INFO line on `mlxcel.access` per HTTP exchange, written when the
exchange is over (a stream's once its last event is sent), as `key=value` pairs:

    method=POST path=/v1/responses status=200 ms=431.2 id=resp_ab12 key=alice in=812 out=64

`id` is the response the exchange created or named, `key` the name of the API key it
carried (a short hash for a key without a name; `-` without one), `in`/`out` its input
and output tokens; a value not known is `-`. Never the key, never any request text: the
path is logged as sent (percent-encoded), and of its query only the parameters' names,
with the values of those that are flags (`beta=true`, as Claude Code sends it).

Routes tell the log what only they know through the exchange's note (`exchange_note`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import cast
from urllib.parse import quote

from hypercorn.typing import HTTPScope

from mlxcel.http.guards import TENANT_KEY, exchange_scope
from mlxcel.items import ResponseRecord, Usage

log = logging.getLogger("mlxcel.access")

NOTE_KEY = "mlxcel.note"
"""Where an exchange's scope keeps its note."""
_PATH_SAFE = "/:@!$&'()*+,;=-._~%"

_FLAG_PARAMS = frozenset({"beta", "stream"})
"""Query parameters whose values are logged: switches, never text a client wrote."""


def _query(raw: bytes) -> str:
    """The query as logged: `?name` per parameter, `?name=value` for the flags."""
    if not raw:
        return ""
    parts = []
    for pair in raw.decode("latin-1").split("&"):
        name, sep, value = pair.partition("=")
        shown = f"{name}={value}" if sep and name in _FLAG_PARAMS and len(value) <= 8 else name
        parts.append(quote(shown, safe="=%"))
    return "?" + "&".join(parts)


@dataclass(slots=True)
class ExchangeNote:
    """What a route learned about its exchange, for its access-log line. One exchange
    owns it; a stream's body fills in the usage when the response ends."""

    response_id: str | None = None
    usage: Usage | None = None

    def response(self, response_id: str, usage: Usage | None = None) -> None:
        self.response_id = response_id
        self.usage = usage


def exchange_note() -> ExchangeNote:
    """The note of the exchange being served (a fresh, unlogged one outside an exchange
    wrapped by `http/exchange.py`)."""
    found = exchange_scope().get(NOTE_KEY)
    return found if isinstance(found, ExchangeNote) else ExchangeNote()


def note_record(record: ResponseRecord) -> None:
    """The exchange being served created or names this response (its usage so far)."""
    exchange_note().response(record.id, record.usage)


def log_exchange(scope: HTTPScope, status: int | None, seconds: float) -> None:
    """Write the exchange's line (if INFO is on for `mlxcel.access`)."""
    if not log.isEnabledFor(logging.INFO):
        return
    extra = cast(dict[str, object], scope)
    note = extra.get(NOTE_KEY)
    note = note if isinstance(note, ExchangeNote) else ExchangeNote()
    tenant = extra.get(TENANT_KEY)
    usage = note.usage
    raw = scope.get("raw_path") or scope["path"].encode()
    fields = {
        "method": quote(scope["method"], safe=""),
        "path": quote(raw.decode("latin-1"), safe=_PATH_SAFE) + _query(scope["query_string"]),
        "status": "-" if status is None else str(status),
        "ms": f"{seconds * 1000:.1f}",
        "id": quote(note.response_id, safe="") if note.response_id else "-",
        "key": tenant if isinstance(tenant, str) and tenant else "-",
        "in": "-" if usage is None else str(usage.input_tokens),
        "out": "-" if usage is None else str(usage.output_tokens),
    }
    log.info("%s", " ".join(f"{name}={value}" for name, value in fields.items()))
