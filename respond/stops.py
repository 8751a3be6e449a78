"""Stop strings found in a reply while it streams.

Text that may still turn into a stop string is held back, so no byte of a stop string
is ever released; once one is found, the text before it is the last the reply shows.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopScanner:
    """Finds a request's stop strings in streamed text, holding back only the tail that could
    still begin one, so no stop string is ever sent to the client."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.found = False
        self.matched: str | None = None
        """The stop string the reply ended at (the first in the text, once found)."""

    def feed(self, text: str) -> str:
        """The text that may be shown now (empty once a stop string was found)."""
        if not self._stops:
            return text
        if self.found:
            return ""
        held = self._held + text
        ends = [(i, s) for s in self._stops if (i := held.find(s)) >= 0]
        if ends:
            end, self.matched = min(ends, key=lambda pair: pair[0])
            self.found, self._held = True, ""
            return held[:end]
        keep = self._partial(held)
        self._held = held[len(held) - keep :] if keep else ""
        return held[: len(held) - keep]

    def finish(self) -> str:
        """The held text, released when the reply ends without a stop string."""
        held, self._held = self._held, ""
        return held

    def _partial(self, text: str) -> int:
        """How many characters at the end of `text` begin some stop string."""
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest
