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


def shared_stream_pdf(pages: int, stream: bytes) -> bytes:
    """A PDF 1.5 file of `pages` pages that all draw one content stream (`stream`, stored
    Flate-compressed once). The page objects sit in a compressed object stream and the
    cross-reference table is a stream too, so a thousand pages cost a few kilobytes."""
    packed = list(range(1, pages + 4))  # catalog, page tree, pages, font
    content, objstm, xref = pages + 4, pages + 5, pages + 6
    font = pages + 3
    bodies = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids ["
        + b" ".join(b"%d 0 R" % (3 + n) for n in range(pages))
        + b"] /Count %d /MediaBox [0 0 612 792] /Resources << /Font << /F1 %d 0 R >> >> >>"
        % (pages, font),
        *(b"<< /Type /Page /Parent 2 0 R /Contents %d 0 R >>" % content for _ in range(pages)),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    header, joined = b"", b""
    for number, body in zip(packed, bodies, strict=True):
        header += b"%d %d " % (number, len(joined))
        joined += body + b"\n"
    inside = zlib.compress(header + joined, 9)
    out = bytearray(b"%PDF-1.5\n")
    offsets: dict[int, int] = {}
    drawn = zlib.compress(stream, 9)
    for number, dictionary, data in (
        (content, b"<< /Length %d /Filter /FlateDecode >>" % len(drawn), drawn),
        (
            objstm,
            b"<< /Type /ObjStm /N %d /First %d /Length %d /Filter /FlateDecode >>"
            % (len(packed), len(header), len(inside)),
            inside,
        ),
    ):
        offsets[number] = len(out)
        out += b"%d 0 obj\n%s\nstream\n%s\nendstream\nendobj\n" % (number, dictionary, data)
    offsets[xref] = len(out)
    rows = [b"\x00" + (0).to_bytes(4, "big") + (0xFFFF).to_bytes(2, "big")]
    rows += [b"\x02" + objstm.to_bytes(4, "big") + n.to_bytes(2, "big") for n in range(len(packed))]
    rows += [b"\x01" + offsets[n].to_bytes(4, "big") + b"\x00\x00" for n in (content, objstm, xref)]
    table = zlib.compress(b"".join(rows), 9)
    out += b"%d 0 obj\n<< /Type /XRef /Size %d /W [1 4 2] /Root 1 0 R /Length %d " % (
        xref,
        xref + 1,
        len(table),
    )
    out += b"/Filter /FlateDecode >>\nstream\n%s\nendstream\nendobj\n" % table
    out += b"startxref\n%d\n%%%%EOF\n" % offsets[xref]
    return bytes(out)


def costly_pdf() -> bytes:
    """Some 14 KB: a thousand pages sharing one content stream of some 1.9 million
    operators (one line of text, then `q Q` pairs), which a reader that parses each
    page's stream anew parses a thousand times."""
    drawing = b"BT /F1 12 Tf 72 700 Td (Costly) Tj ET\n" + b"q Q\n" * 950_000
    return shared_stream_pdf(1000, drawing)
