"""Reasoning traces: `<think>…</think>` split from the answer while it streams.

A trace is recognised only at the very start of a reply, or from the first token when
the chat template's generation prompt already opened one (ends with `<think>\\n`).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxcel.respond.tool_parsers import partial_suffix

THINK = "<think>"
END_THINK = "</think>"


@dataclass(frozen=True, slots=True)
class ReasoningPiece:
    text: str


@dataclass(frozen=True, slots=True)
class AnswerPiece:
    text: str


Piece = ReasoningPiece | AnswerPiece


class ReasoningSplitter:
    """Splits a reasoning model's text into its reasoning and its answer as it streams, by
    the think tags, holding back only what could still be a tag."""

    def __init__(self, *, opened: bool) -> None:
        self._state = "reasoning" if opened else "start"
        self._buffer = ""
        self._skip_newlines = opened  # the newlines right after a tag are layout

    @property
    def reasoning(self) -> bool:
        """True while the text being produced is (or may still be) reasoning."""
        return self._state != "answer"

    @property
    def undecided(self) -> bool:
        """True while the reply may still turn out to open a trace, or not."""
        return self._state == "start"

    def feed(self, text: str) -> list[Piece]:
        self._buffer += text
        out: list[Piece] = []
        if self._skip_newlines and self._state != "start":
            self._buffer = self._buffer.lstrip("\n")
            self._skip_newlines = not self._buffer
        if self._state == "start":
            lead = self._buffer.lstrip()
            if lead.startswith(THINK):
                self._state = "reasoning"
                self._buffer = lead[len(THINK) :].lstrip("\n")
                self._skip_newlines = not self._buffer
            elif THINK.startswith(lead):
                return out  # could still become `<think>`
            else:
                self._state = "answer"
        if self._state == "reasoning":
            end = self._buffer.find(END_THINK)
            if end < 0:
                keep = partial_suffix(self._buffer, END_THINK)
                piece = self._buffer[: len(self._buffer) - keep]
                self._buffer = self._buffer[len(self._buffer) - keep :]
                return [ReasoningPiece(piece)] if piece else out
            if end:
                out.append(ReasoningPiece(self._buffer[:end]))
            self._buffer = self._buffer[end + len(END_THINK) :].lstrip("\n")
            self._skip_newlines = not self._buffer
            self._state = "answer"
        if self._buffer:
            out.append(AnswerPiece(self._buffer))
            self._buffer = ""
        return out

    def finish(self) -> list[Piece]:
        rest, self._buffer = self._buffer, ""
        if not rest:
            return []
        return [ReasoningPiece(rest)] if self._state == "reasoning" else [AnswerPiece(rest)]
