"""What an SMS costs: the segments a text is billed as.

A single SMS carries 140 bytes. A text written only in the GSM 03.38 alphabet (GSM-7: 7
bits a character) fits 160 characters in one; the alphabet's extension characters
(``^ { } \\ [ ] ~ | €`` and the form feed) take two (an escape, then the character). Any
other character — an emoji, "ñ" is GSM but "á" is not, a curly quote — makes the whole text
UCS-2 (16 bits a UTF-16 unit): 70 units in one. A longer text is sent concatenated: each
part gives 6 bytes to the header that joins them again, so 153 GSM-7 characters or 67
UCS-2 units a segment, and the carrier bills every segment as one SMS. Twilio cuts a body
into segments itself (up to 1,600 characters a message); `split` cuts them the same way
(never an escape pair or a surrogate pair across two segments) so `count` says what a
reply costs before it is sent (docs/sms.md).
"""

from __future__ import annotations

from dataclasses import dataclass

GSM7 = "GSM-7"
UCS2 = "UCS-2"
# The GSM 03.38 default alphabet, and its extension table (each an escape and a character).
BASIC = ("@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?"
         "¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà")
EXTENDED = "\f^{}\\[~]|€"
_BASIC, _EXTENDED = frozenset(BASIC), frozenset(EXTENDED)
SINGLE = {GSM7: 160, UCS2: 70}  # one SMS
PART = {GSM7: 153, UCS2: 67}  # one segment of a concatenated SMS


@dataclass(frozen=True)
class Cost:
    encoding: str  # GSM-7 or UCS-2
    units: int  # septets (GSM-7) or UTF-16 units (UCS-2)
    segments: int


def encoding(text: str) -> str:
    """GSM-7 when every character is in the GSM alphabet or its extension; else UCS-2."""
    return GSM7 if all(c in _BASIC or c in _EXTENDED for c in text) else UCS2


def _width(char: str, code: str) -> int:
    if code == GSM7:
        return 2 if char in _EXTENDED else 1
    return 2 if ord(char) > 0xFFFF else 1  # a surrogate pair in UTF-16


def split(text: str) -> list[str]:
    """`text` cut into the segments a carrier delivers it in (one when it fits a single SMS)."""
    code = encoding(text)
    widths = [_width(c, code) for c in text]
    if sum(widths) <= SINGLE[code]:
        return [text] if text else []
    parts, start, used = [], 0, 0
    for index, width in enumerate(widths):
        if used + width > PART[code]:
            parts.append(text[start:index])
            start, used = index, 0
        used += width
    parts.append(text[start:])
    return parts


def count(text: str) -> Cost:
    """How `text` is billed: its encoding, its length in that encoding's units, its segments."""
    code = encoding(text)
    return Cost(code, sum(_width(c, code) for c in text), len(split(text)))
