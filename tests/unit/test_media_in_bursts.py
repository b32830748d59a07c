"""Files as part of their burst (conversations.media): the per-burst cap applied to what
is fetched, an interrupted turn's files shown to the turn that carries it, and downloads
that leave nothing of their own behind — real bytes from a local Bot API."""

import asyncio
from datetime import timedelta

import pytest
from django.utils import timezone

from conversations.ingest import MediaRef
from conversations.media import fetching, for_agents
from conversations.models import MediaFile, MediaState
from delivery import transports
from tests.support.e2e import TOKEN, telegram_channel
from tests.unit.test_media import fetch, jpeg, media_root, ref  # noqa: F401 (media_root: an autouse fixture)


@pytest.fixture
def tg(make_channel, fake_telegram):
    return telegram_channel(make_channel, fake_telegram)


def fetched_and_stored(files):
    """Fetch these claimed files from their platform (the local Bot API) and store them."""
    async def fetch_all():
        try:
            return [await fetching.fetch(file) for file in files]
        finally:
            await transports.close_clients()  # the bot's HTTP session belongs to this loop
    for file, data in zip(files, asyncio.run(fetch_all()), strict=True):
        assert fetching.mark_stored(file, file.owner, fetching.save(file, data))


def test_a_file_that_would_take_its_burst_over_the_cap_is_not_fetched_and_the_model_is_told(
        tg, fake_telegram, settings):
    """Three photos of one burst whose declared sizes add up past the cap: the third is
    settled skipped when claimed — even by a second worker claiming it first, before
    the others are stored — never downloaded, and described to the model with why. The
    same photo sizes in another burst are fetched: the cap is per burst."""
    from conversations import flushing
    from conversations.ingest import Inbound, admit

    photos = [jpeg(64 + 10 * i, 48) for i in range(3)]
    given = [fake_telegram.add_file(TOKEN, data) for data in photos]
    settings.AGENTLOOP_MEDIA_MAX_TURN_BYTES = len(photos[0]) + len(photos[1]) + len(photos[2]) // 2
    t0 = timezone.now() - timedelta(minutes=1)
    for n, file in enumerate(given):
        admit(tg, Inbound(platform_message_id=str(n), chat_id="7", sender_id="7", media_type="photo",
                                   media=MediaRef(key=file["file_unique_id"], ref=file["file_id"], kind="photo",
                                                  declared_size=file["file_size"])), now=t0 + timedelta(seconds=n))
    first, second, third = MediaFile.objects.order_by("pk")
    assert fetching.claim([third.pk], "w2") == []  # w2 comes first: the burst's order decides, not the claim's
    assert MediaFile.objects.get(pk=third.pk).state == MediaState.SKIPPED
    fetched_and_stored(fetching.claim([second.pk], "w2") + fetching.claim([first.pk], "w1"))
    assert sorted(fake_telegram.downloads) == sorted(f["file_id"] for f in given[:2])

    [turn] = flushing.flush_due(now=t0 + timedelta(seconds=30))
    parts = for_agents.parts(for_agents.of_turn(turn))
    assert [p["type"] for p in parts] == ["image_url", "image_url", "text"]
    assert parts[2]["text"] == (f"[photo: {len(photos[2])} bytes; not read: over what one burst may carry "
                                f"({settings.AGENTLOOP_MEDIA_MAX_TURN_BYTES / 1000:.0f} KB in all)]")

    other = fake_telegram.add_file(TOKEN, jpeg(200, 100))  # another chat's burst: room of its own
    admit(tg, Inbound(platform_message_id="9", chat_id="8", sender_id="8", media_type="photo",
                               media=MediaRef(key=other["file_unique_id"], ref=other["file_id"], kind="photo",
                                              declared_size=other["file_size"])))
    [file] = fetching.claim(fetching.due_ids(10), "w1")
    fetched_and_stored([file])
    assert fake_telegram.downloads[-1] == other["file_id"]


def test_an_interrupted_turns_files_are_shown_to_the_turn_that_carries_it_once(make_channel):
    """A photo's turn interrupted by the next message (double texting `interrupt`): the
    next turn carries its text, and its agent is shown its photo too — once, even when a
    second interrupt carries both forward again, and in the history once it is done."""
    from conversations import engine, flushing, turns
    from conversations.ingest import Inbound, admit
    from conversations.models import TurnState

    channel = make_channel("tg", kind="telegram", double_texting="interrupt", window_media=1.0)
    t0 = timezone.now() - timedelta(minutes=5)

    def message(n, at, **kw):
        admit(channel, Inbound(platform_message_id=str(n), chat_id="4", sender_id="4", **kw),
              now=t0 + timedelta(seconds=at))

    message(1, 0, media_type="photo", text="¿qué es?", media=ref("c1"))
    photo = MediaFile.objects.get()
    fetching.mark_stored(photo, "w1", fetching.save(*fetching.claim([photo.pk], "w1"), jpeg()))
    [first] = flushing.flush_due(now=t0 + timedelta(seconds=5))
    assert turns.start(first.pk, "w1")
    message(2, 6, text="es de ayer.")  # interrupts the first turn: its input is carried
    [second] = flushing.flush_due(now=t0 + timedelta(seconds=10))
    assert second.merged_input == "[photo] ¿qué es?\nes de ayer."
    assert second.has_media and for_agents.file_ids_of_turn(second) == [photo.pk]
    assert turns.start(second.pk, "w1")
    message(3, 11, text="y la de hoy", media_type="photo", media=ref("c1"))  # the same photo again
    [third] = flushing.flush_due(now=t0 + timedelta(seconds=15))
    assert [item.id for item in for_agents.of_turn(third)] == [photo.pk]
    parts = for_agents.parts(for_agents.of_turn(third))
    assert [p["type"] for p in parts] == ["image_url"]

    assert turns.start(third.pk, "w1")
    turns.finish(third.pk, "w1", state=TurnState.DONE, reply_text="Una boleta.")
    message(4, 20, text="gracias")
    [fourth] = flushing.flush_due(now=t0 + timedelta(seconds=25))
    [user, _] = engine.conversation_history(fourth.conversation, fourth)
    assert user["content"].count(f"[photo: image/jpeg, {len(jpeg())} bytes]") == 1


def test_downloads_leave_no_tls_context_of_their_own_behind(tg, fake_telegram):
    """A download's client uses the process's one TLS context: a closed client's reference
    cycles (httpx's pool, anyio's stream) then hold no context with its own CA store —
    ~0.9 MB of OpenSSL's memory each, which tracemalloc does not see and the worker's
    collector (agentloop.core.collector) reclaims only in its rare full collections."""
    import gc
    import ssl

    given = [fake_telegram.add_file(TOKEN, jpeg(64 + i, 48)) for i in range(3)]
    gc.collect()
    gc.disable()  # as good as the worker's rare collections, for the length of the test
    try:
        for file in given:
            fetch(tg, file["file_id"])
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, ssl.SSLContext)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []
