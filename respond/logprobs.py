"""The answer's token log-probabilities, matched to the text a tool-call parser lets
through.

The builder feeds the parser the answer in chunks, each with the log-probabilities of the
tokens that released it. The parser's text pieces are that text in order, less the markup
it swallows into calls: each piece takes the log-probabilities of the chunks it covers,
and chunks wholly swallowed before it are dropped.
"""

from __future__ import annotations

from collections import deque

from mlxcel.items import TokenLogprob


class TokenTrail:
    def __init__(self) -> None:
        self._text = ""  # the parser's input from the end of the last piece matched
        # Each unmatched chunk: where it begins and ends in `_text`, and its tokens'
        # log-probabilities.
        self._chunks: deque[tuple[int, int, tuple[TokenLogprob, ...]]] = deque()

    def add(self, text: str, logprobs: tuple[TokenLogprob, ...]) -> None:
        """A chunk of answer text fed to the parser, with its tokens' log-probabilities."""
        self._chunks.append((len(self._text), len(self._text) + len(text), logprobs))
        self._text += text

    def take(self, piece: str) -> tuple[TokenLogprob, ...]:
        """The log-probabilities of the chunks `piece` covers, wholly or in part (none
        when the piece is not the parser's input)."""
        at = self._text.find(piece)
        if at < 0:
            return ()
        end = at + len(piece)
        taken: list[TokenLogprob] = []
        while self._chunks and self._chunks[0][0] < end:
            _, chunk_end, logprobs = self._chunks.popleft()
            if chunk_end > at:  # not swallowed into a call before the piece
                taken += logprobs
        self._text = self._text[end:]
        self._chunks = deque((s - end, e - end, lp) for s, e, lp in self._chunks)
        return tuple(taken)
