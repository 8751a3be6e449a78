"""File content parts (`input_file`; Chat Completions' `file`): a document the client
sends becomes text the model reads, in a block headed by its filename.

Only `file_data` is read: a base64 data URL (`data:<type>;base64,…`), or bare base64
whose type the filename's extension tells. Plain text, Markdown, CSV and JSON are read
as UTF-8 as validation runs; a PDF is only decoded then, and its text is read after
validation by a worker process (`http/pdf_reading.py`), so a costly file never holds a
preparation thread. Any other type is a 400 naming it, as is a `file_id` (there is no
files API here). A `file_url` is never fetched, as input images are never fetched: under
`--images placeholder` the model reads a note that the file was not read, under
`--images reject` it is a 400 (`check_file_urls`).

The block is `[file: NAME]`, the text, `[end of file: NAME]`, each on its own line. A
file cannot close its block early: a name with a control character (a line break among
them) is a 400, and a line of the text that begins with `[end of file` (whatever its case,
after blank space) is read with a backslash before it.

Bounded like every other input: `MAX_FILE_BYTES` decoded bytes per file (checked on the
base64's length before decoding), `MAX_FILE_CHARS` characters of text per file, and for
PDFs the page and work limits of `http/pdf_reading.py`. Malformed input of any kind is a
400, never a 500.
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from mlxcel.errors import InvalidRequest

MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_FILE_CHARS = 1_000_000
MAX_PDF_PAGES = 1000
PDF = "application/pdf"
TEXT_TYPES = frozenset(
    {"application/json", "application/x-ndjson", "application/csv", "application/markdown"}
)
"""Besides `text/*`: the types read as UTF-8 text."""
EXTENSIONS = {".md": "text/markdown", ".markdown": "text/markdown", ".jsonl": "application/json"}
FILE_URL_NOTE = "[file omitted: {name} was sent by URL, and this server does not fetch URLs]"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""Control characters (Unicode's Cc) and the line and paragraph separators: every character
that breaks a line, and none a file name needs."""
_END_LINE = re.compile(
    r"(\A|[\n\r\v\f\x1c-\x1e\x85\u2028\u2029])"
    r"((?:[^\S\n\r\v\f\x1c-\x1e\x85\u2028\u2029]|[\u200b-\u200f\u2060-\u2064\ufeff])*)"
    r"(?=\[end of file)",
    re.IGNORECASE,
)
"""A line (as `str.splitlines` splits them) that begins, after blank or invisible
characters, as a block's end does."""
_ESCAPE = r"\1\2\\"
"""The line as it was, a backslash before its `[`."""


@dataclass(frozen=True, slots=True)
class PendingPdf:
    """A PDF decoded as validation ran, its text still to read."""

    name: str
    data: bytes


_pending: ContextVar[list[FilePart] | None] = ContextVar("mlxcel_pending_pdfs", default=None)


@contextmanager
def collecting_pdfs() -> Iterator[list[FilePart]]:
    """The file parts holding a PDF that validation meets within this block, in order:
    their text is read after validation (`http/pdf_reading.py`)."""
    found: list[FilePart] = []
    token = _pending.set(found)
    try:
        yield found
    finally:
        _pending.reset(token)


def file_block(name: str, text: str) -> str:
    """What the model reads for a file: its text between lines naming it, any line of
    the text that would read as the block's end escaped."""
    escaped = _END_LINE.sub(_ESCAPE, text)
    return f"[file: {name}]\n{escaped}\n[end of file: {name}]"


def file_text(
    file_data: str | None, file_url: str | None, file_id: str | None, filename: str | None
) -> str | PendingPdf:
    """What the model reads for one file part, or a PDF whose text is still to read (a
    ValueError, which validation reports at the part's place, for anything it cannot
    read)."""
    if file_id is not None and file_data is None:
        raise ValueError("'file_id' cannot be used: this server has no files API; send 'file_data'")
    if file_data is None:
        if file_url is None:
            raise ValueError("an input_file needs 'file_data' (or a 'file_url')")
        return FILE_URL_NOTE.format(name=filename or file_url[:200])
    kind, payload = _split_data(file_data, filename)
    data = _decoded(payload)
    name = filename or "untitled"
    if kind == PDF:
        if not data.startswith(b"%PDF-"):
            raise ValueError("the file sent as application/pdf is not a PDF")
        return PendingPdf(name, data)
    return checked_block(name, _utf8(data, kind))


def checked_block(name: str, text: str) -> str:
    """`file_block`, or a ValueError for a text over `MAX_FILE_CHARS`."""
    if len(text) > MAX_FILE_CHARS:
        raise ValueError(
            f"the text of file {name[:100]!r} is {len(text)} characters; at most "
            f"{MAX_FILE_CHARS} are read from one file"
        )
    return file_block(name, text)


def _split_data(file_data: str, filename: str | None) -> tuple[str, str]:
    """The media type and the base64 payload."""
    if file_data.startswith("data:"):
        header, comma, payload = file_data.partition(",")
        if not comma or not header.endswith(";base64"):
            raise ValueError("'file_data' must be a base64 data URL (data:<type>;base64,…)")
        kind = header[len("data:") : -len(";base64")].split(";")[0].strip().lower()
    else:
        payload, kind = file_data, _guessed(filename)
    if not (kind == PDF or kind.startswith("text/") or kind in TEXT_TYPES):
        raise ValueError(
            f"files of type {kind[:100]!r} cannot be read; send text, Markdown, CSV, JSON or PDF"
        )
    return kind, payload


def _guessed(filename: str | None) -> str:
    """The type a filename's extension names ("" when none does)."""
    if not filename:
        raise ValueError(
            "bare base64 'file_data' needs a 'filename' whose extension names its type"
        )
    suffix = "." + filename.rsplit(".", 1)[-1].lower() if "." in filename else ""
    return EXTENSIONS.get(suffix) or mimetypes.guess_type("f" + suffix)[0] or "unknown"


def _decoded(payload: str) -> bytes:
    if len(payload) // 4 * 3 > MAX_FILE_BYTES:
        raise ValueError(f"the file is larger than the {MAX_FILE_BYTES}-byte limit for one file")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("'file_data' is not valid base64") from None


def _utf8(data: bytes, kind: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError(f"the {kind} file is not UTF-8 text") from None


def _no_control(value: str | None) -> str | None:
    """A name shown in the block's lines cannot break a line of its own."""
    if value is not None and _CONTROL.search(value):
        raise ValueError("cannot contain a control character (such as a line break)")
    return value


def check_file_urls(raw_input: object, placeholders: bool, param: str = "input") -> None:
    """400 for a `file_url` part when the server answers input it cannot read with a 400
    (`--images reject`): it fetches no URL, of an image or a file."""
    if placeholders or not isinstance(raw_input, list):
        return
    for n, item in enumerate(raw_input):
        for key in ("content", "output"):
            parts = getattr(item, key, None)
            for k, part in enumerate(parts if isinstance(parts, list) else ()):
                if getattr(part, "file_url", None) is None or getattr(part, "file_data", None):
                    continue
                raise InvalidRequest(
                    "The input names a file by URL, but this server does not fetch URLs "
                    "(--images reject); send the file as 'file_data'.",
                    param=f"{param}[{n}].{key}[{k}].file_url",
                    code="unsupported_file_url",
                )


class FilePart(BaseModel):
    """What both kinds of file part share: `text`, what the model reads, set from the
    file whatever a client sent under this name; a PDF's once it has been read."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    text: str = ""
    _pdf: PendingPdf | None = PrivateAttr(default=None)

    @property
    def pdf(self) -> PendingPdf | None:
        """The PDF whose text is still to read, if any."""
        return self._pdf

    def take(self, read: str | PendingPdf) -> None:
        """Keep what was read, or note the PDF for the reading after validation."""
        if isinstance(read, str):
            object.__setattr__(self, "text", read)
            return
        pending = _pending.get()
        if pending is None:  # a body is validated only by `http/body.py`, which collects
            raise ValueError("a PDF can only be read from a request body")
        self._pdf = read
        pending.append(self)

    def read_as(self, text: str) -> None:
        """The PDF's text has been read: the model reads it in its block."""
        pdf = self._pdf
        assert pdf is not None, "only a part holding a PDF is read"
        object.__setattr__(self, "text", checked_block(pdf.name, text))
        self._pdf = None


class ChatFile(BaseModel):
    """Chat Completions' `file` object: `file_data` (with a `filename`) or a `file_id`."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)
    file_data: str | None = None
    file_id: str | None = None
    filename: str | None = Field(default=None, max_length=1024)

    _filename = field_validator("filename")(_no_control)


class ChatFilePart(FilePart):
    """`{"type": "file", "file": {...}}` in a Chat Completions user message, read into
    `text` as validation runs."""

    type: Literal["file"]
    file: ChatFile

    @model_validator(mode="after")
    def _read(self) -> ChatFilePart:
        file = self.file
        self.take(file_text(file.file_data, None, file.file_id, file.filename))
        return self


class InputFilePart(FilePart):
    """`input_file`: a document, read into `text` as validation runs."""

    type: Literal["input_file"]
    file_data: str | None = None
    file_url: str | None = None
    file_id: str | None = None
    filename: str | None = Field(default=None, max_length=1024)

    _names = field_validator("filename", "file_url")(_no_control)

    @model_validator(mode="after")
    def _read(self) -> InputFilePart:
        self.take(file_text(self.file_data, self.file_url, self.file_id, self.filename))
        return self
