"""One PDF's text, read in a process of its own: `python -I pdf_worker.py PAGES CHARS
TOKENS CPU_SECS`, the file on stdin, one JSON object on stdout. A file costly to read then
costs a process the server kills when its time is up, never a thread it must wait for.

Stands alone (the standard library and pypdf), so the process starts without the server's
imports. Its limits:
- `RLIMIT_CPU`: past `CPU_SECS` of CPU time the kernel sends SIGXCPU, which ends the
  reading with an answer; a second later, SIGKILL. No core file is written.
- content tokens (operators and their operands, each array or dictionary's elements
  counted too), counted as pages are read across the whole file: a content stream drawn
  by several pages is parsed, and counted, once for each. pypdf bounds each stream alone
  (and each stream's inflation), not their sum.
- pages and characters of text: a file over them is refused before or while it is read.

The answer: `{"text": …, "cpu": seconds}`, or `{"refused": reason, "cpu": seconds}` (the
reason is said to the client), with `"detail"` for a file pypdf could not read (logged).
Exit status 0 either way; any other end is the parent's to report.
"""

from __future__ import annotations

import io
import json
import logging
import resource
import signal
import sys
from typing import Any


class Refused(BaseException):
    """The file is over a limit. A BaseException, so that no `except Exception` inside
    pypdf can take it for a damaged object and carry on reading."""


def main(argv: list[str]) -> int:
    pages, chars, tokens, cpu_secs = (int(arg) for arg in argv)
    _limit_cpu(cpu_secs)
    logging.disable(logging.CRITICAL)  # pypdf's warnings on damaged files go nowhere
    answer: dict[str, Any]
    try:
        answer = {"text": _text(sys.stdin.buffer.read(), pages, chars, tokens)}
    except Refused as exc:
        answer = {"refused": str(exc)}
    except Exception as exc:  # pypdf raises many kinds on a damaged file
        answer = {
            "refused": f"the PDF could not be read ({type(exc).__name__})",
            "detail": f"{type(exc).__name__}: {str(exc)[:500]}",
        }
    usage = resource.getrusage(resource.RUSAGE_SELF)
    answer["cpu"] = usage.ru_utime + usage.ru_stime
    # A lone surrogate pypdf decoded from a font's map becomes "?" rather than an error.
    sys.stdout.buffer.write(json.dumps(answer, ensure_ascii=False).encode("utf-8", "replace"))
    return 0


def _limit_cpu(secs: int) -> None:
    """The kernel's limit on this process's CPU time; SIGXCPU at it ends the reading."""

    def over(signum: int, frame: object) -> None:
        raise Refused(f"the PDF is too costly to read: it took more than {secs} s of CPU time")

    signal.signal(signal.SIGXCPU, over)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    kill = secs + 1 if hard == resource.RLIM_INFINITY else min(secs + 1, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (min(secs, kill), kill))


def _text(data: bytes, max_pages: int, max_chars: int, max_tokens: int) -> str:
    """The text of each page, in order."""
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data))
    count = len(reader.pages)
    if count > max_pages:
        raise Refused(f"the PDF has {count} pages; at most {max_pages}")
    budget = _Budget(max_tokens)
    texts: list[str] = []
    read = 0
    for page in reader.pages:
        texts.append(page.extract_text(visitor_operand_before=budget.charge) or "")
        read += len(texts[-1])
        if read > max_chars:
            raise Refused(
                f"the PDF's text is more than {max_chars} characters; at most {max_chars} "
                "are read from one file"
            )
    return "\n\n".join(texts)


class _Budget:
    """Content tokens left to parse in the whole file."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.left = tokens

    def charge(self, operator: object, operands: object, cm: object, tm: object) -> None:
        """Called by pypdf for each operation of a content stream it has parsed."""
        cost = 1
        for operand in operands if isinstance(operands, list | dict) else ():
            cost += 1 + (len(operand) if isinstance(operand, list | dict) else 0)
        self.left -= cost
        if self.left < 0:
            raise Refused(
                f"the PDF is too costly to read: its pages draw more than {self.tokens} "
                "content tokens (a stream that several pages share counts for each)"
            )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
