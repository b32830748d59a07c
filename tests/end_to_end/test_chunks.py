"""Long replies, chunk by chunk: the split (delivery.chunks), the ledger's per-chunk
record, and a real worker killed (SIGKILL, a failpoint) between chunks, then started
again: chunks known delivered never resent, only an ambiguous chunk labelled."""

import signal

import pytest

from delivery import chunks, ledger
from delivery.chunks import split, units
from delivery.models import OutboundKind, OutboundMessage, OutboundState
from tests.conftest import wait_until
from tests.end_to_end.test_ledger_e2e import conversation_for, delivered, texts
from tests.support.e2e import UNPACED, telegram_channel

TELEGRAM = 4096


def squeeze(text):
    return "".join(text.split())


# --- the split -------------------------------------------------------------------------------


def test_a_short_text_is_one_chunk_and_telegram_counts_utf16_units():
    assert split("hola", 10) == ["hola"]
    assert units("😀") == 2 and units("♻️") == 2 and units("ñ") == 1
    assert split("😀" * 5, 10) == ["😀" * 5]
    assert split("😀" * 6, 10) == ["😀" * 5, "😀"]


def test_astral_characters_are_counted_twice_and_never_cut():
    text = "😀" * 3000  # 6,000 units in 3,000 characters: under 4,096 characters, over 4,096 units
    parts = split(text, TELEGRAM)
    assert [units(p) for p in parts] == [4096, 1904]
    assert "".join(parts) == text
    odd = "a" + "😀" * 3000  # the limit falls in the middle of a surrogate pair: cut before it
    assert [units(p) for p in split(odd, TELEGRAM)] == [4095, 1906]


def test_an_emoji_keeps_its_modifiers_and_a_flag_its_pair():
    family = "👩\u200d👩\u200d👧"  # one drawn character: joined by ZWJs
    text = "x" * 4090 + family + "👍🏽" * 3
    first, *_ = split(text, TELEGRAM)
    assert first == "x" * 4090
    flags = "🇪🇸" * 2000  # regional indicators go in pairs
    assert all(len(p) % 2 == 0 for p in split(flags, 4095))


def test_cuts_prefer_a_paragraph_then_a_line_then_a_space():
    para = "a" * 2500 + "\n\n" + "b" * 1000 + "\n" + "c" * 500 + " " + "d" * 3000
    assert split(para, TELEGRAM)[0] == "a" * 2500
    line = "a" * 2500 + "\n" + "b" * 1000 + " " + "c" * 3000
    assert split(line, TELEGRAM) == ["a" * 2500, "b" * 1000 + " " + "c" * 3000]
    words = " ".join(f"palabra{i}" for i in range(700))
    parts = split(words, TELEGRAM)
    assert all(units(p) <= TELEGRAM for p in parts) and len(parts) == 2
    assert parts[0].endswith("palabra" + parts[0].rsplit("palabra", 1)[1]) and not parts[1].startswith(" ")
    assert " ".join(parts) == words  # only the space cut on is dropped
    early = "a" * 100 + "\n\n" + "b" * 5000  # a paragraph break too early: a hard cut at the limit
    assert [units(p) for p in split(early, TELEGRAM)] == [4096, 1006]


def test_a_code_block_is_never_split_when_it_fits_in_a_chunk():
    block = "```python\n" + "".join(f"x_{i} = {i}  # a line of code\n" for i in range(120)) + "```"
    assert 2000 < units(block) < TELEGRAM
    text = "Intro.\n\n" + "p " * 1000 + "\n\n" + block + "\n\nFin."
    parts = split(text, TELEGRAM)
    assert any(block in p for p in parts), [p[:30] for p in parts]
    assert all(units(p) <= TELEGRAM for p in parts)
    assert squeeze("".join(parts)) == squeeze(text)
    # A block that would straddle the limit and starts early: a short first chunk rather
    # than a cut block.
    intro = "Mira: " + "y " * 500 + "\n"
    parts = split(intro + block + " " + "z " * 1500, TELEGRAM)
    assert parts[0] == intro and parts[1].startswith(block)


def test_inline_code_is_not_cut():
    span = "`" + "un comando largo " * 10 + "`"
    text = "a " * (4096 // 2 - 20) + span + " fin"
    parts = split(text, TELEGRAM)
    assert any(span in p for p in parts)


def test_a_code_block_longer_than_the_limit_falls_back_to_lines_then_a_hard_split():
    lines = "```\n" + "".join(f"linea {i:05}\n" for i in range(800)) + "```"
    parts = split(lines, TELEGRAM)
    assert len(parts) == 3 and all(units(p) <= TELEGRAM for p in parts)
    assert "\n".join(parts) == lines  # cut at the block's own lines
    solid = "```" + "x" * 9000 + "```"
    parts = split(solid, TELEGRAM)
    assert [units(p) for p in parts] == [4096, 4096, 814] and "".join(parts) == solid


def test_never_an_empty_chunk():
    assert split("a" * 4096 + "\n\n\n   \n", TELEGRAM) == ["a" * 4096]
    assert split("", TELEGRAM) == [""]


# --- the ledger row ----------------------------------------------------------------------------

PARAGRAPHS = [f"Parte {n}. " + " ".join(f"palabra{n}-{i}" for i in range(290)) for n in range(1, 5)]
LONG = "\n\n".join(PARAGRAPHS)  # four paragraphs of ~3,900 units: four chunks


@pytest.mark.django_db
def test_a_long_reply_is_stored_as_its_chunks_each_with_room_for_the_marker(make_channel):
    channel = make_channel("tg", kind="telegram", platform_settings={
        "bot_token": "1:x", "api_base": "http://127.0.0.1:9"})
    row = ledger.enqueue(conversation_for(channel), LONG, kind=OutboundKind.REPLY)
    row.refresh_from_db()
    assert row.chunks == PARAGRAPHS
    assert all(units(ledger.RECOVERY_PREFIX + c) <= TELEGRAM for c in row.chunks)
    short = ledger.enqueue(conversation_for(channel, "102"), "hola", kind=OutboundKind.REPLY)
    assert short.chunks == [] and ledger.parts(short) == ["hola"]
    web = make_channel("web", kind="webchat")
    assert ledger.enqueue(conversation_for(web), LONG, kind=OutboundKind.REPLY).chunks == []  # no limit there


@pytest.mark.django_db
def test_a_claim_resumes_at_the_first_chunk_not_known_delivered_labelled_only_if_it_had_started(make_channel):
    channel = make_channel("tg", kind="telegram", platform_settings={
        "bot_token": "1:x", "api_base": "http://127.0.0.1:9", **UNPACED})
    row = ledger.enqueue(conversation_for(channel), LONG, kind=OutboundKind.REPLY)
    [first] = ledger.claim_due("w1")
    assert not first.needs_marker and first.chunks_started == 1 and ledger.text_to_send(first) == PARAGRAPHS[0]
    # Chunks 1 and 2 delivered and recorded; chunk 3 not started when the worker died.
    assert ledger.note_progress(row.pk, first.claim_token, {"chunks_started": 2})
    assert ledger.note_progress(row.pk, first.claim_token, {"chunks_delivered": 2})
    assert not ledger.note_progress(row.pk, "another claim", {"chunks_delivered": 3})  # only the claim's holder
    [again] = ledger.claim_due("w2", dead_owners={"w1"})
    assert (again.chunks_delivered, again.chunks_started, again.attempts) == (2, 3, 2)
    assert not again.needs_marker and ledger.text_to_send(again) == PARAGRAPHS[2]
    # Chunk 3's send started, then the worker died: the next claim labels chunk 3.
    [third] = ledger.claim_due("w3", dead_owners={"w2"})
    assert third.needs_marker and ledger.text_to_send(third) == ledger.RECOVERY_PREFIX + PARAGRAPHS[2]
    # Given back unsent, it keeps its label for the next claim.
    assert ledger.release([third], "w3") == 1
    [fourth] = ledger.claim_due("w4")
    assert fourth.needs_marker and fourth.chunks_delivered == 2


# --- a real worker killed between chunks ----------------------------------------------------------


def run_killed_at(processes, fake_telegram, make_channel, point):
    channel = telegram_channel(make_channel, fake_telegram)
    row = ledger.enqueue(conversation_for(channel), LONG, kind=OutboundKind.REPLY)
    assert len(row.chunks) == 4
    doomed = processes.worker(wait=False, AGENTLOOP_FAILPOINT=point)
    wait_until(lambda: doomed.popen.poll() is not None, timeout=30, message=f"the worker to die at {point}")
    assert doomed.popen.returncode == -signal.SIGKILL and f"failpoint {point.partition('@')[0]}: killing" in doomed.output()
    row.refresh_from_db()
    assert row.state == OutboundState.ATTEMPTING and row.chunks_delivered == 2
    processes.worker()  # its boot sweep takes the dead worker's row
    wait_until(delivered(1), timeout=30, message="the reply delivered")
    row.refresh_from_db()
    return row, texts(fake_telegram)


@pytest.mark.e2e
def test_killed_after_chunk_2_recorded_resumes_at_chunk_3_plain(processes, make_channel, fake_telegram):
    row, sent = run_killed_at(processes, fake_telegram, make_channel, "ledger.after_chunk@2")
    assert sent == PARAGRAPHS  # 1–2 once, 3 never started so plain, 4 once
    assert row.attempts == 2 and not row.needs_marker
    calls = fake_telegram.calls("sendMessage")
    assert all(str(c.params["chat_id"]) == "101" for c in calls)


@pytest.mark.e2e
def test_killed_after_chunk_3_sent_and_not_recorded_resends_chunk_3_labelled(processes, make_channel,
                                                                            fake_telegram):
    row, sent = run_killed_at(processes, fake_telegram, make_channel, "ledger.after_chunk_send@3")
    assert sent == [*PARAGRAPHS[:3], ledger.RECOVERY_PREFIX + PARAGRAPHS[2], PARAGRAPHS[3]]
    assert row.attempts == 2 and row.needs_marker
    assert all(len(t.encode("utf-16-le")) // 2 <= TELEGRAM for t in sent)


@pytest.mark.e2e
def test_a_reply_thread_and_reply_to_kept_first_chunk_only(processes, make_channel, fake_telegram):
    channel = telegram_channel(make_channel, fake_telegram)
    ledger.enqueue(conversation_for(channel), LONG, kind=OutboundKind.REPLY, reply_target="31", thread_id="9")
    processes.worker()
    wait_until(delivered(1), timeout=30, message="the reply delivered")
    calls = fake_telegram.calls("sendMessage")
    assert [c.params["text"] for c in calls] == PARAGRAPHS
    assert calls[0].params["reply_parameters"]["message_id"] == 31
    assert all("reply_parameters" not in c.params for c in calls[1:])
    assert all(str(c.params["message_thread_id"]) == "9" for c in calls)
    row = OutboundMessage.objects.get()
    assert row.platform_message_id == "4"  # the last chunk's (the fake numbers a chat's messages from 1)
    assert (row.chunks_started, row.attempts) == (4, 1) and chunks.units(LONG) > 3 * TELEGRAM


@pytest.mark.django_db(transaction=True)
def test_the_safety_sweep_sends_a_long_reply_chunk_by_chunk_recording_each(make_channel, fake_telegram):
    """django-q2's sweep sends from a plain thread: the chunks' progress is written from
    another thread's connection (sync_to_async), and the row is recorded as it goes."""
    from datetime import timedelta

    from django.utils import timezone

    channel = telegram_channel(make_channel, fake_telegram)
    row = ledger.enqueue(conversation_for(channel), LONG, kind=OutboundKind.REPLY)
    # A previous sweep delivered chunks 1–2 and died before starting chunk 3.
    OutboundMessage.objects.filter(pk=row.pk).update(
        state=OutboundState.FAILED, attempts=1, chunks_started=2, chunks_delivered=2,
        next_attempt_at=timezone.now(), created_at=timezone.now() - timedelta(minutes=2))
    assert ledger.safety_sweep(budget=20) == {"abandoned": 0, "sent": 1}
    assert texts(fake_telegram) == PARAGRAPHS[2:]
    row.refresh_from_db()
    assert (row.state, row.chunks_started, row.chunks_delivered) == (OutboundState.DELIVERED, 4, 3)


@pytest.mark.e2e
def test_with_the_ledger_off_a_long_reply_still_goes_out_whole(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram)
    web, _ = processes.web(wait=False), processes.worker(AGENTLOOP_DELIVERY_LEDGER="false")
    from tests.support.e2e import send

    send(web, "tg", 101, "\n\n".join(PARAGRAPHS[:2]))  # the echo agent answers it back: two chunks
    calls = fake_telegram.wait_for("sendMessage", count=2, timeout=15)
    assert [c.params["text"] for c in calls] == PARAGRAPHS[:2]
    assert not OutboundMessage.objects.exists()
