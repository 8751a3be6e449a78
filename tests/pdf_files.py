"""Real PDF files for the tests, written by hand: pages whose content streams draw text
in a standard font (so any PDF reader extracts it), optionally Flate-compressed."""

from __future__ import annotations

import zlib


def pdf(pages: list[str], *, compress: bool = False, raw_stream: bytes | None = None) -> bytes:
    """A valid PDF with one page per text (an empty text draws nothing). `raw_stream`
    replaces the first page's content stream, already Flate-compressed."""
    count = len(pages)
    font = 3 + 2 * count
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids ["
        + b" ".join(b"%d 0 R" % (3 + 2 * n) for n in range(count))
        + b"] /Count %d >>" % count,
    ]
    for n, text in enumerate(pages):
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
            b"/Resources << /Font << /F1 %d 0 R >> >> >>" % (4 + 2 * n, font)
        )
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        stream = f"BT /F1 12 Tf 72 700 Td ({escaped}) Tj ET".encode("latin-1") if text else b""
        extra = b""
        if raw_stream is not None and n == 0:
            stream, extra = raw_stream, b" /Filter /FlateDecode"
        elif compress:
            stream, extra = zlib.compress(stream), b" /Filter /FlateDecode"
        objects.append(b"<< /Length %d%s >>\nstream\n%s\nendstream" % (len(stream), extra, stream))
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)
