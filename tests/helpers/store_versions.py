"""The store's encodings as earlier releases wrote them, made by hand from this release's,
for the tests that read them back (`tests/store/test_codec.py`, `tests/http/test_store_upgrade.py`)."""

from __future__ import annotations

import json

FLAGS = ("store", "background")
"""What version 1 kept in a record's echo (version 2 keeps them on the record)."""


def as_version_1(body: bytes | str) -> bytes:
    """The version 1 encoding of the value `body` encodes (version 2): a record's flags,
    left out at their defaults as then, inside its echo; a conversation as it is."""
    tree = json.loads(body)
    assert tree["v"] == 2, tree["v"]
    for flag in FLAGS:
        if flag in tree:
            tree["echo"][flag] = tree.pop(flag)
    tree["v"] = 1
    text = json.dumps(tree, ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8", "surrogatepass")
