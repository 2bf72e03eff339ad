"""Control and user-defined pieces matched verbatim in text, and a client's text kept from forming control pieces.

Matching: one Aho-Corasick automaton over the pieces (`ahocorasick_rs`, the Rust aho-corasick crate), leftmost
first and, at one place, longest first, as llama.cpp's special-token partition and the `tokenizers` library's
added tokens match them. It runs in time linear in the text whatever the pieces are: a vocabulary of 2,000 pieces
sharing a prefix costs what a plain one does (the matcher it replaced tried every length at every place).

A client's text (a chat message, a completion's prompt, `power run --prompt`) is tokenised as the text it is:
`Verbatim.as_text` puts DEFUSED (U+FFFF, a Unicode noncharacter, which no client may send) after every
character that ends a control piece, and a control piece followed by DEFUSED is text. DEFUSED is taken out of
the text between matches before it is tokenised, so the client's characters are tokenised as they were sent,
while the chat template's own markers, which carry no DEFUSED, stay control tokens. The mark follows the end of
a piece, so a template that tests a message (`content.startswith("<think>")`, `content.split("</think>")`)
reads it as it was sent. What it cannot see: a control piece whose first part the template writes and whose
end the client sends is caught (its end carries the mark), but one that a client's text begins and the
template's own text ends is not; templates write their markers whole.
"""

from __future__ import annotations

from typing import Iterable

from ahocorasick_rs import AhoCorasick, MatchKind

DEFUSED = "\uffff"


class Verbatim:
    """Pieces matched verbatim in raw text: `split` cuts a text at them; `as_text` marks a client's text."""

    def __init__(self, pieces: Iterable[tuple[str, int, bool]]) -> None:
        """`pieces`: (text, id, is a control piece); a repeated text keeps its last id."""
        table = {text: (token, control) for text, token, control in pieces if text}
        self._texts = list(table)
        self._ids = [table[text][0] for text in self._texts]
        self._control = [table[text][1] for text in self._texts]
        self._matcher = AhoCorasick(self._texts, matchkind=MatchKind.LeftmostLongest) if self._texts else None
        self._mark = str.maketrans({text[-1]: text[-1] + DEFUSED for text, (_, control) in table.items() if control})

    def split(self, text: str) -> list[tuple[str, int | None]]:
        """`text` as fragments: (a verbatim piece, its id) or (the text between them, None), DEFUSED taken out."""
        parts: list[tuple[str, int | None]] = []
        begin = 0
        for index, start, end in self._matcher.find_matches_as_indexes(text) if self._matcher else ():
            if self._control[index] and text.startswith(DEFUSED, end):
                continue  # a client's text: not a control token
            if begin < start:
                parts.append((text[begin:start].replace(DEFUSED, ""), None))
            parts.append((self._texts[index], self._ids[index]))
            begin = end
        if begin < len(text):
            parts.append((text[begin:].replace(DEFUSED, ""), None))
        return [(fragment, token) for fragment, token in parts if fragment]

    def as_text(self, text: str) -> str:
        """A client's `text`, marked so that no control piece in it is read as one (ValueError if it holds
        DEFUSED itself)."""
        if DEFUSED in text:
            raise ValueError(f"it holds U+FFFF (a Unicode noncharacter) at character {text.index(DEFUSED)}")
        return text.translate(self._mark)
