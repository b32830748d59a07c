"""The adaptive window table, the word lists and the caps — pure logic, injected time."""

from datetime import UTC, datetime, timedelta

import pytest

from conversations import windows
from conversations.windows import CLOSED, GREETING, MEDIA, NEUTRAL, OPEN, DebounceSettings, Latest, plan_flush

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
DEFAULTS = DebounceSettings()


@pytest.mark.parametrize("text, kind", [
    ("¿Me agendas la cita?", CLOSED),
    ("Agéndame las horas en mi calendario.", CLOSED),
    ("Gracias!", CLOSED),
    ("hola", GREETING),
    ("Hola!", GREETING),
    ("Buenos días", GREETING),
    ("hola, una consulta", GREETING),
    ("hi", GREETING),
    ("Confirmo las horas y", OPEN),
    ("necesito agendar con", OPEN),
    ("I need to book a meeting with", OPEN),
    ("primero esto,", OPEN),
    ("déjame pensar...", OPEN),
    ("déjame pensar…", OPEN),
    ("te cuento:", OPEN),
    ("Confirmo las horas de psicología", NEUTRAL),
    ("hola quiero agendar", NEUTRAL),  # a greeting with content is not a bare greeting
    ("ok", NEUTRAL),
    ("", NEUTRAL),
])
def test_window_table(text, kind):
    assert windows.classify(text, DEFAULTS) == kind


def test_default_seconds_match_the_spec():
    assert [DEFAULTS.seconds(k) for k in (CLOSED, GREETING, OPEN, NEUTRAL)] == [1.2, 4.0, 4.0, 2.5]


def test_word_lists_are_configurable():
    custom = DebounceSettings(greetings=windows.parse_words("ahoy, que onda"),
                              conjunctions=windows.parse_words("plus\nalso"))
    assert windows.classify("Ahoy", custom) == GREETING
    assert windows.classify("¿Qué onda?", custom) == GREETING
    assert windows.classify("hola", custom) == NEUTRAL
    assert windows.classify("this also", custom) == OPEN
    assert windows.classify("this y", custom) == NEUTRAL


def test_parse_words_normalises_case_accents_and_blanks():
    assert windows.parse_words(" Buenos DÍAS ,\n,hola ") == frozenset({"buenos dias", "hola"})


def plan(text, *, now=T0, first=T0, count=1, media=False, album=False, settings=DEFAULTS):
    return plan_flush(Latest(text, media=media, album=album), now=now, first_message_at=first,
                      message_count=count, settings=settings)


def test_window_deadline_is_last_message_plus_its_window():
    p = plan("Confirmo las horas y")
    assert (p.flush_at, p.reason, p.window_kind, p.window_seconds) == (T0 + timedelta(seconds=4.0), "window", OPEN, 4.0)
    assert plan("¿Listo?").flush_at == T0 + timedelta(seconds=1.2)


def test_each_message_re_arms_the_window():
    later = T0 + timedelta(seconds=3)
    assert plan("y también", now=later, count=2).flush_at == later + timedelta(seconds=4.0)


def test_max_wait_caps_a_buffer_that_never_goes_quiet():
    settings = DebounceSettings(max_wait=10.0)
    now = T0 + timedelta(seconds=8)
    p = plan("sigo escribiendo y", now=now, count=5, settings=settings)
    assert (p.flush_at, p.reason) == (T0 + timedelta(seconds=10), "max_wait")


def test_max_wait_already_passed_flushes_now():
    now = T0 + timedelta(seconds=30)  # the buffer waited for a running turn
    p = plan("más", now=now, count=2, settings=DebounceSettings(max_wait=10.0))
    assert (p.flush_at, p.reason) == (now, "max_wait")


def test_max_messages_flushes_at_once():
    p = plan("y", count=3, settings=DebounceSettings(max_messages=3))
    assert (p.flush_at, p.reason) == (T0, "max_messages")


def test_media_without_a_caption_gets_the_media_window():
    p = plan("", media=True)
    assert (p.flush_at, p.reason, p.window_kind, p.window_seconds) == (T0 + timedelta(seconds=2.5), "window", MEDIA, 2.5)


def test_a_caption_is_classified_like_text():
    p = plan("¿qué dice esta boleta?", media=True)
    assert (p.flush_at, p.reason, p.window_kind) == (T0 + timedelta(seconds=1.2), "window", CLOSED)
    assert plan("hola", media=True).window_kind == GREETING


def test_an_album_item_keeps_the_buffer_open_for_the_album_window():
    captioned = plan("¿cuánto suman?", media=True, album=True)  # closed (1.2 s), but more items may follow
    assert (captioned.flush_at, captioned.reason, captioned.window_kind, captioned.window_seconds) == (
        T0 + timedelta(seconds=3.0), "album", CLOSED, 3.0)
    bare = plan("", media=True, album=True)
    assert (bare.flush_at, bare.reason) == (T0 + timedelta(seconds=3.0), "album")
    longer = plan("hola", media=True, album=True)  # a window longer than the album's is kept
    assert (longer.flush_at, longer.reason) == (T0 + timedelta(seconds=4.0), "window")


def test_the_question_after_the_album_gets_its_own_window():
    later = T0 + timedelta(seconds=0.5)
    p = plan("¿cuánto suman en total?", now=later, count=2)
    assert (p.flush_at, p.reason) == (later + timedelta(seconds=1.2), "window")


def test_media_flushes_at_once_when_the_channel_says_so():
    at_once = DebounceSettings(media_at_once=True)
    for text, album in (("", False), ("¿y esto?", False), ("", True)):
        p = plan(text, media=True, album=album, settings=at_once)
        assert (p.flush_at, p.reason) == (T0, "media")
    assert plan("¿y esto?", settings=at_once).reason == "window"  # text is not media


def test_caps_still_bound_media():
    assert plan("", media=True, album=True, count=3, settings=DebounceSettings(max_messages=3)).reason == "max_messages"
    p = plan("", media=True, album=True, now=T0 + timedelta(seconds=14), settings=DebounceSettings(max_wait=15.0))
    assert (p.flush_at, p.reason) == (T0 + timedelta(seconds=15), "max_wait")


def test_an_albums_items_count_as_one_message():
    assert windows.message_starts(["", "a", "a", "a", "", "b", "b", "a"]) == [0, 1, 4, 5, 7]
    assert windows.message_starts([]) == []
