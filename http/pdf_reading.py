"""The text of the PDFs a request body holds, read after its validation, each by a worker
process of its own (`http/pdf_worker.py`).

Why a process: pypdf parses a page's content stream anew for each page that draws it, so
a few kilobytes of PDF can ask for hours of CPU. In a thread that would hold one of the
two preparation threads (`prepare/offload.py`) every request needs, and a thread cannot be
stopped, so a server told to stop would wait for it. A process is killed when its time is
up, when the request is cancelled, or when the server starts to drain (the request is then
a 503); the kernel's CPU limit ends it even if the server itself is killed.

The limits, each a 400 naming the part when passed (`input[0].content[1]`):
- `MAX_PDF_TOKENS` content tokens parsed across one file (`http/pdf_worker.py` says how
  they are counted): a machine-independent bound on the work;
- `PDF_CPU_SECS` of CPU time per file, the kernel's limit on the worker;
- `PDF_WALL_SECS` from the worker's start to its answer (a loaded machine, a worker that
  waits rather than computes);
- `REQUEST_PDF_CPU_SECS` of CPU time for all of one request's PDFs together, so that a
  body of many files, each within its own limits, is bounded too.
At most `PDF_WORKERS` workers run at once per server; a request reads its PDFs one after
another.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from pydantic import BaseModel
from trio.lowlevel import RunVar

from mlxcel.errors import InvalidRequest, ShuttingDown
from mlxcel.http.files import MAX_FILE_CHARS, MAX_PDF_PAGES, FilePart, PendingPdf
from mlxcel.http.handles import handles
from mlxcel.prepare.offload import off_loop

log = logging.getLogger(__name__)

MAX_PDF_TOKENS = 2_000_000
"""About 4 s of pypdf's parsing on a slow machine; a few hundred dense pages."""
PDF_CPU_SECS = 5
PDF_WALL_SECS = 20.0
REQUEST_PDF_CPU_SECS = 20.0
PDF_WORKERS = 2
"""Like the preparation threads: the machines this serves have few cores."""
WORKER = Path(__file__).with_name("pdf_worker.py")

_workers: RunVar[trio.CapacityLimiter] = RunVar("mlxcel_pdf_workers")


def pdf_workers() -> trio.CapacityLimiter:
    """The run's limiter of PDF workers (one per Trio run, as a test may start several)."""
    try:
        return _workers.get()
    except LookupError:
        limiter = trio.CapacityLimiter(PDF_WORKERS)
        _workers.set(limiter)
        return limiter


class _Refused(Exception):
    """A PDF over a limit or unreadable: the reason, said to the client."""


@dataclass(frozen=True, slots=True)
class _Read:
    text: str
    cpu_secs: float


async def read_pdfs(body: BaseModel, parts: Sequence[FilePart]) -> None:
    """Read the text of each of `parts` (found in `body` as it was validated), in order;
    a 400 naming the first that cannot be read, a 503 if the server starts to stop."""
    places = await off_loop(_places, body, {id(part) for part in parts})
    stopping = handles().stopping
    spent = 0.0
    for part in parts:
        place, pdf = places.get(id(part)), part.pdf
        if place is None or pdf is None:
            continue  # validated in a union branch that was not kept
        try:
            left = REQUEST_PDF_CPU_SECS - spent
            if left <= 0:
                raise _Refused(
                    "the request's PDF files are too costly to read: together they took "
                    f"more than {REQUEST_PDF_CPU_SECS:g} s of CPU time"
                )
            read = await _read(pdf, min(PDF_CPU_SECS, math.ceil(left)), stopping)
            spent += read.cpu_secs
            await off_loop(part.read_as, read.text)  # escaping a long text takes a while
        except (_Refused, ValueError) as exc:
            raise InvalidRequest(
                f"Invalid value for '{place}': {exc}.", param=place, code="invalid_value"
            ) from None


async def _read(pdf: PendingPdf, cpu_secs: int, stopping: trio.Event) -> _Read:
    """One file's text from a worker, within its limits."""
    argv = [sys.executable, "-I", str(WORKER)]
    argv += [str(n) for n in (MAX_PDF_PAGES, MAX_FILE_CHARS, MAX_PDF_TOKENS, cpu_secs)]
    done: subprocess.CompletedProcess[bytes] | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_cancel_when_set, stopping, nursery.cancel_scope)
        async with pdf_workers():
            with trio.move_on_after(PDF_WALL_SECS):
                # The answer is held whole: at most `MAX_FILE_CHARS` of text, the worker stops past it.
                done = await trio.run_process(
                    argv,
                    stdin=pdf.data,
                    capture_stdout=True,
                    stderr=subprocess.DEVNULL,
                    check=False,
                    deliver_cancel=_kill,
                )
        nursery.cancel_scope.cancel()
    if done is None and stopping.is_set():
        raise ShuttingDown(
            "The server is shutting down; retry on another server.", code="server_shutting_down"
        )
    if done is None:
        raise _Refused(f"the PDF is too costly to read: not read within {PDF_WALL_SECS:g} s")
    return await off_loop(_answer, done, cpu_secs)


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _kill(process: trio.Process) -> None:
    """At once: a worker has nothing to save."""
    process.kill()


def _answer(done: subprocess.CompletedProcess[bytes], cpu_secs: int) -> _Read:
    """The worker's answer: its text, or the reason it refused the file."""
    if done.returncode < 0:  # killed: SIGKILL at its hard CPU limit, or a SIGXCPU unheard
        raise _Refused(f"the PDF is too costly to read: it took more than {cpu_secs} s of CPU time")
    try:
        answer: dict[str, Any] = json.loads(done.stdout)
        text, refused, cpu = answer.get("text"), answer.get("refused"), float(answer["cpu"])
    except (ValueError, KeyError, TypeError, AttributeError):
        log.warning("the PDF reader ended with status %d and no answer", done.returncode)
        raise _Refused("the PDF could not be read") from None
    if "detail" in answer:
        log.info("a PDF could not be read: %s", answer["detail"])
    if isinstance(refused, str):
        raise _Refused(refused)
    if not isinstance(text, str):
        raise _Refused("the PDF could not be read")
    return _Read(
        text.strip() or "(this PDF has no text that can be extracted: it may be a scan)", cpu
    )


def _places(body: BaseModel, wanted: set[int]) -> dict[int, str]:
    """Where each object of `wanted` (by id) sits in `body`, as an error's `param` names
    it (`input[0].content[1]`)."""
    found: dict[int, str] = {}
    pending: list[tuple[str, object]] = [("", body)]
    while pending and len(found) < len(wanted):
        place, node = pending.pop()
        if id(node) in wanted:
            found[id(node)] = place
        elif isinstance(node, BaseModel):
            for name, field in type(node).model_fields.items():
                key = field.alias or name
                pending.append((f"{place}.{key}" if place else key, getattr(node, name)))
        elif isinstance(node, list | tuple):
            pending.extend((f"{place}[{n}]", child) for n, child in enumerate(node))
    return found
