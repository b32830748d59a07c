"""The adaptive debounce window: how long to wait after a message for the next one.

Pure functions over text and times, so the table is tested with injected time.
The signal is the text of the last message (bots cannot see the user typing):

    bare greeting ("hola", "una consulta")        -> greeting window (4.0 s)
    ends in a comma, '...', ':' or a conjunction   -> open window     (4.0 s)
    ends in ? ! .                                  -> closed window   (1.2 s)
    anything else                                  -> neutral window  (2.5 s)
    a photo, voice note, file… without a caption   -> media window    (2.5 s)

A greeting wins over its punctuation: "¡Hola!" is still almost always followed
by the actual question. A caption is text like any other: a photo captioned "¿qué
dice esta boleta?" gets the closed window. An item of an album (several photos sent
as one: Telegram's `media_group_id`) keeps the buffer open at least the album window
(3.0 s) — the items of one album arrive one by one, as fast as the phone uploads them —
and the album counts as one message towards `max_messages`. A channel may still flush
media at once (`media_at_once`), as earlier versions always did.
"""

import functools
import re
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final, Literal

from django.utils.translation import gettext

DEFAULT_GREETINGS = (
    "hola", "holi", "buenas", "buenos dias", "buenas tardes", "buenas noches", "buen dia",
    "que tal", "oye", "hey", "hi", "hello", "hello there", "good morning", "good afternoon",
    "good evening", "una consulta", "una pregunta", "consulta", "pregunta", "quick question",
    "a question", "ola", "saludos", "yo",
)
DEFAULT_CONJUNCTIONS = (
    "y", "e", "o", "u", "ni", "pero", "con", "para", "por", "que", "porque", "de", "del", "en",
    "a", "al", "sin", "como", "pues", "entonces", "ademas", "tambien", "luego", "mas",
    "and", "or", "but", "with", "for", "to", "so", "because", "then", "also", "plus", "of", "in",
)

WindowKind = Literal["closed", "greeting", "open", "neutral", "media"]
CLOSED: Final = "closed"
GREETING: Final = "greeting"
OPEN: Final = "open"
NEUTRAL: Final = "neutral"
MEDIA: Final = "media"

_ELLIPSIS = ("...", "…")
_OPEN_ENDINGS = (",", ":", ";")
_CLOSED_ENDINGS = ("?", "!", ".")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


@dataclass(frozen=True)
class DebounceSettings:
    closed: float = 1.2
    greeting: float = 4.0
    open: float = 4.0
    neutral: float = 2.5
    greetings: frozenset[str] = field(default_factory=lambda: frozenset(DEFAULT_GREETINGS))
    conjunctions: frozenset[str] = field(default_factory=lambda: frozenset(DEFAULT_CONJUNCTIONS))
    max_wait: float = 15.0
    max_messages: int = 10
    media: float = 2.5
    album: float = 3.0
    media_at_once: bool = False

    def seconds(self, kind: WindowKind) -> float:
        return {CLOSED: self.closed, GREETING: self.greeting, OPEN: self.open, NEUTRAL: self.neutral,
                MEDIA: self.media}[kind]


# Bounds on what an operator may set. A window is how long a person waits after their last
# message before the agent starts: a person who sees no answer for a minute thinks the bot is
# broken, and a 99,999 s window is a typo, not a choice. max_wait is the wait since the
# buffer's *first* message, which a person typing in bursts can stretch past one window: five
# minutes covers any real burst and still answers a person who never stops.
WINDOW_LIMIT: Final = 60.0
MAX_WAIT_LIMIT: Final = 300.0
_WINDOWS: Final = ("closed", "greeting", "open", "neutral", "media", "album")


def problems(settings: DebounceSettings) -> dict[str, str]:
    """Why these settings cannot work, by setting name ({} when they can)."""
    found = {name: gettext("at most %(limit)s seconds: a person is waiting for the answer")
             % {"limit": f"{WINDOW_LIMIT:g}"} for name in _WINDOWS if getattr(settings, name) > WINDOW_LIMIT}
    longest = max(_WINDOWS, key=lambda name: getattr(settings, name))
    if settings.max_wait > MAX_WAIT_LIMIT:
        found["max_wait"] = gettext("at most %(limit)s seconds: a buffer must answer a person who never stops "
                                    "writing") % {"limit": f"{MAX_WAIT_LIMIT:g}"}
    elif settings.max_wait < getattr(settings, longest) and longest not in found:
        # The cap would cut that window short every time: one of the two is a mistake.
        found["max_wait"] = gettext("shorter than the longest window (%(name)s, %(seconds)s s): at least "
                                    "that long, or shorten the window") % {
            "name": longest, "seconds": f"{getattr(settings, longest):g}"}
    return found


@functools.lru_cache(maxsize=256)
def parse_words(text: str) -> frozenset[str]:
    """Comma- or newline-separated words and phrases, normalised like message text."""
    parts = re.split(r"[,\n]", text or "")
    return frozenset(" ".join(words(p)) for p in parts if words(p))


def fold(text: str) -> str:
    """Lowercase without accents, so 'Buenos días' matches 'buenos dias'."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def words(text: str) -> list[str]:
    return _WORD.findall(fold(text))


def is_bare_greeting(text: str, greetings: frozenset[str]) -> bool:
    """True when the message is nothing but greeting phrases ("hola, una consulta")."""
    tokens = words(text)
    if not tokens:
        return False
    longest = max((len(g.split()) for g in greetings), default=0)
    # covered[i]: tokens[:i] can be split into greeting phrases.
    covered = [True] + [False] * len(tokens)
    for end in range(1, len(tokens) + 1):
        for size in range(1, min(longest, end) + 1):
            if covered[end - size] and " ".join(tokens[end - size:end]) in greetings:
                covered[end] = True
                break
    return covered[-1]


def classify(text: str, settings: DebounceSettings) -> WindowKind:
    """Which window the last message of a buffer gets."""
    stripped = (text or "").strip()
    if is_bare_greeting(stripped, settings.greetings):
        return GREETING
    if stripped.endswith(_ELLIPSIS) or stripped.endswith(_OPEN_ENDINGS):
        return OPEN
    if stripped.endswith(_CLOSED_ENDINGS):
        return CLOSED
    tokens = words(stripped)
    if tokens and tokens[-1] in settings.conjunctions:
        return OPEN
    return NEUTRAL


@dataclass(frozen=True, slots=True)
class Latest:
    """What the window is planned by: the buffer's latest message — its text (a
    media message's caption), whether it carries media, whether it is an album's item."""

    text: str
    media: bool = False
    album: bool = False


def message_starts(album_ids: list[str]) -> list[int]:
    """Where each message begins, as messages count (`max_messages`): of a buffer's
    messages in order, given their album ids, the index of each one that is not the next
    item of the album before it."""
    return [i for i, album in enumerate(album_ids) if not (i and album and album == album_ids[i - 1])]


@dataclass(frozen=True)
class FlushPlan:
    flush_at: datetime
    reason: str  # a FlushReason value
    window_kind: str
    window_seconds: float


def plan_flush(
    latest: Latest, *, now: datetime, first_message_at: datetime, message_count: int, settings: DebounceSettings,
) -> FlushPlan:
    """The deadline of a buffer whose latest message is `latest`, received at `now`.

    Every new message re-plans (re-arms) the deadline; the caps bound a buffer that
    never goes quiet (max_wait) or grows without end (max_messages; an album counts
    once, so the caller counts it so).
    """
    if latest.media and settings.media_at_once:
        return FlushPlan(now, "media", MEDIA, 0.0)
    if message_count >= settings.max_messages:
        return FlushPlan(now, "max_messages", "cap", 0.0)
    kind: WindowKind = MEDIA if latest.media and not latest.text.strip() else classify(latest.text, settings)
    seconds, reason = settings.seconds(kind), "window"
    if latest.album and settings.album > seconds:
        seconds, reason = settings.album, "album"  # the album's next item may still be on its way
    window_deadline = now + timedelta(seconds=seconds)
    cap = first_message_at + timedelta(seconds=settings.max_wait)
    if cap < window_deadline:
        return FlushPlan(max(cap, now), "max_wait", kind, seconds)
    return FlushPlan(window_deadline, reason, kind, seconds)
