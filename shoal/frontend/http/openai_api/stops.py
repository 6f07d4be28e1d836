"""Stop strings over streamed text, as OpenAI applies them: the output ends just before the first
occurrence of any stop string, which is not returned.

``StopScanner.push`` takes each new text piece and returns what may be sent now: text that
could still be the beginning of a stop string is held back until the next piece decides it.
``flush`` returns what is held back once the stream ends without a stop.
"""

from __future__ import annotations


class StopScanner:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._held = ""  # text received but not yet returned
        self.stopped = False

    def push(self, piece: str) -> str:
        """The text that may be sent now; sets ``stopped`` once a stop string appeared (the
        text before it is returned, nothing after)."""
        if self.stopped:
            return ""
        if not self._stops:
            return piece
        text = self._held + piece
        cut = min((index for index in (text.find(stop) for stop in self._stops) if index >= 0),
                  default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return text[:cut]
        keep = self._partial_suffix(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial_suffix(self, text: str) -> int:
        """The length of the longest end of ``text`` that begins some stop string."""
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest
