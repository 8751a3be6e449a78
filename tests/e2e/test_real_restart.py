"""End to end on the real model: a conversation kept in a SQLite store outlives its server."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from server_process import start_server

pytestmark = pytest.mark.e2e

server = contextlib.contextmanager(start_server)


def test_a_conversation_goes_on_after_a_restart(tmp_path: Path) -> None:
    store = ("--store", f"sqlite:{tmp_path / 'store.sqlite3'}", "--parallel", "1")
    store += ("--prompt-cache-dir", str(tmp_path / "prompt-cache"))  # not the user's folder
    with server(tmp_path / "first", *store) as first, first.client() as client:
        conv = client.conversations.create()
        for text in ("My name is Zorblax. Reply OK.", "I live in Lisbon. Reply OK."):
            client.responses.create(
                model=first.alias,
                input=text,
                conversation=conv.id,
                max_output_tokens=8,
                temperature=0,
            )
    with server(tmp_path / "second", *store) as second, second.client() as client:
        items = client.conversations.items.list(conv.id, order="asc")
        assert len(items.data) == 4
        third = client.responses.create(
            model=second.alias,
            input="What is my name? Answer with the name only.",
            conversation=conv.id,
            max_output_tokens=16,
            temperature=0,
        )
        assert "zorblax" in third.output_text.lower(), third.output_text
