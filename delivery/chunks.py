"""Splitting a long reply into platform-sized chunks (pure; no Django).

Lengths are counted as the platform counts them: Telegram's 4096 is in UTF-16 code
units, so an emoji outside the Basic Multilingual Plane counts two. A chunk ends at the
best boundary in its second half — a paragraph, else a line, else a space — and never
inside a fenced code block (```…```) or an inline code span (`…`) that fits in a chunk
of its own: such a block starts the next chunk instead, even if that leaves this one
short. Only a block longer than the limit, or a run with no boundary at all, is cut
hard — and then never inside a character, nor between an emoji and its modifiers.
"""

import re
import unicodedata

PARAGRAPH, LINE, SPACE = 3, 2, 1  # how good a cut is; a block's start is as good as a paragraph

_BOUNDARIES = ((PARAGRAPH, re.compile(r"\n(?:[ \t]*\n)+")), (LINE, re.compile(r"\n")),
               (SPACE, re.compile(r"[ \t]+")))
_FENCE = re.compile(r"```")
_INLINE_CODE = re.compile(r"`[^`\n]+`")
_ZWJ = "\u200d"


def units(text: str) -> int:
    """Length in UTF-16 code units (how Telegram counts a message's length)."""
    return len(text) + sum(1 for c in text if ord(c) > 0xFFFF)


def split(text: str, limit: int) -> list[str]:
    """`text` in order as chunks of at most `limit` UTF-16 units each. The whitespace a
    cut falls on is dropped; nothing else is. Never an empty chunk."""
    if limit < 2:
        raise ValueError("a chunk limit below 2 units cannot hold an astral character")
    chunks: list[str] = []
    rest = text
    while units(rest) > limit:
        end, resume = _cut(rest, limit)
        if rest[:end].strip():
            chunks.append(rest[:end])
        rest = rest[resume:]
    if rest.strip() or not chunks:
        chunks.append(rest)
    return chunks


def _reach(text: str, limit: int) -> int:
    """The longest prefix (in characters) that fits in `limit` units."""
    used = 0
    for index, char in enumerate(text):
        used += 2 if ord(char) > 0xFFFF else 1
        if used > limit:
            return index
    return len(text)


def _atomic(text: str, limit: int) -> list[tuple[int, int]]:
    """Spans not to cut inside: fenced code blocks (an unclosed fence runs to the end)
    and inline code spans outside them — those that fit in a chunk of their own."""
    fences = [m.start() for m in _FENCE.finditer(text)]
    spans = [(fences[i], fences[i + 1] + 3 if i + 1 < len(fences) else len(text)) for i in range(0, len(fences), 2)]
    inline = [m.span() for m in _INLINE_CODE.finditer(text)
              if not any(start <= m.start() < end for start, end in spans)]
    return [(start, end) for start, end in spans + inline if units(text[start:end]) <= limit]


def _cut(text: str, limit: int) -> tuple[int, int]:
    """Where the first chunk ends and the rest resumes."""
    reach = _reach(text, limit)
    atomic = _atomic(text, limit)

    def inside(position: int) -> bool:
        return any(start < position < end for start, end in atomic)

    blocks = [(PARAGRAPH, start, start) for start, _ in atomic if 0 < start <= reach]
    candidates = list(blocks)
    for rank, pattern in _BOUNDARIES:
        candidates += [(rank, m.start(), m.end()) for m in pattern.finditer(text, 0, reach + 1)
                       if 0 < m.start() <= reach and not inside(m.start())]
    late = [c for c in candidates if c[1] >= reach // 2]
    if late:
        _, end, resume = max(late)  # the best kind of boundary, the last of that kind
        return end, max(resume, end)
    if blocks:  # a block that fits starts early: a short chunk rather than a cut block
        _, end, resume = max(blocks, key=lambda c: c[1])
        return end, resume
    end = _hard_cut(text, reach)
    return end, end


def _hard_cut(text: str, reach: int) -> int:
    """Cut at `reach`, moved back so an emoji keeps its modifiers, joiners, variation
    selectors and combining marks, and a flag its two regional indicators."""
    end = reach
    while end > 1 and (_clings(text[end]) or text[end - 1] == _ZWJ):
        end -= 1
    if end > 1 and _regional(text[end]) and _regional(text[end - 1]):
        run = end
        while run > 0 and _regional(text[run - 1]):
            run -= 1
        if (end - run) % 2:  # the cut would part a flag's pair
            end -= 1
    return end if end > 0 else reach


def _clings(char: str) -> bool:
    """A character drawn together with the one before it."""
    code = ord(char)
    return (char == _ZWJ or 0xFE00 <= code <= 0xFE0F or 0x1F3FB <= code <= 0x1F3FF or 0xE0020 <= code <= 0xE007F
            or unicodedata.category(char) in ("Mn", "Me", "Mc"))


def _regional(char: str) -> bool:
    return 0x1F1E6 <= ord(char) <= 0x1F1FF
