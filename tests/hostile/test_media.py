"""Hostile input in files and URLs that reach the workers (docs/security.md): images a
chat user sends, URLs an agent key names, and what a backup of all of it holds.

- IPv6 forms that carry an IPv4 address (issue 51, finding 9): NAT64, 6to4, IPv4-mapped,
  -compatible and -translated, Teredo (its client address XORed), ISATAP. A media URL
  whose host is one of them is judged by the IPv4 inside, and refused before any
  connection when that one is not public: through the real check
  (agentloop.core.addresses) and the real download path a worker takes
  (the API platform's fetch_media: resolve, check, pin, connect).
- Images too large to decode (issue 51, finding 8): a PNG of a few KB that says it is
  13,000 × 13,000 pixels, sent in a chat, is never decoded — neither by the worker
  showing it to the model nor by the web process making its thumbnail — and each says
  why; through the real web server, worker, fake Bot API and fake model, their peak
  memory read from /proc.
- Backups (issue 51, finding 10): `manage.py backup`, run as a process under a umask
  that lets everyone read, writes a file only its owner can read, from its first byte,
  without the live sessions of the admin (a stolen copy signs no one in), and on
  PostgreSQL pg_dump connects with every option of DATABASE_URL (`sslmode`…), not only
  its host, port, user and name."""

import base64
import io
import ipaddress
import struct
import zlib
from pathlib import Path

import pytest
from PIL import Image

from agentloop.core import addresses
from conversations.media import for_agents, links
from conversations.media.download import FileUnavailable, mb
from conversations.models import MediaFile, MediaState
from tests.conftest import BASE_DIR, database_url, is_postgres, wait_until
from tests.end_to_end.test_media_bursts import answered_by_a_model, photo_update, post, settled
from tests.fakes.openai_api import FakeOpenAI
from tests.support import local_http
from tests.support.e2e import TOKEN
from tests.unit.test_media import media_root, stored  # noqa: F401 (media_root: an autouse fixture, files under tmp_path)
from tests.unit.test_media_urls import channel_allowing, fetch


def teredo(server: str, client: str) -> str:
    """A Teredo address (RFC 4380): 2001::/32, the server's IPv4, flags, the client's
    port and IPv4, both XORed with ones (obfuscated)."""
    value = (0x2001_0000 << 96) | (int(ipaddress.IPv4Address(server)) << 64) | (0x8000 << 48) | (0xFFFF << 32)
    return str(ipaddress.IPv6Address(value | (~int(ipaddress.IPv4Address(client)) & 0xFFFF_FFFF)))


# (the address, the IPv4 it carries, how that one is judged)
CARRYING_A_PRIVATE_ONE = [
    ("64:ff9b::a00:1", "10.0.0.1", "private"),  # NAT64, well-known prefix (RFC 6052)
    ("64:ff9b::a9fe:a9fe", "169.254.169.254", "link-local"),
    ("64:ff9b:1::7f00:1", "127.0.0.1", "loopback"),  # NAT64, local-use prefix (RFC 8215)
    ("2002:a00:1::1", "10.0.0.1", "private"),  # 6to4 (RFC 3056)
    ("2002:7f00:1::", "127.0.0.1", "loopback"),
    ("::a00:1", "10.0.0.1", "private"),  # IPv4-compatible (RFC 4291, deprecated)
    ("::7f00:1", "127.0.0.1", "loopback"),
    ("::ffff:0:a9fe:a9fe", "169.254.169.254", "link-local"),  # IPv4-translated (RFC 2765)
    ("::ffff:c0a8:101", "192.168.1.1", "private"),  # IPv4-mapped
    (teredo("65.54.227.120", "10.0.0.1"), "10.0.0.1", "private"),  # Teredo (RFC 4380)
    (teredo("65.54.227.120", "127.0.0.1"), "127.0.0.1", "loopback"),
    ("2a00:1450:4001::5efe:a00:1", "10.0.0.1", "private"),  # ISATAP (RFC 5214)
    ("2a00:1450:4001::200:5efe:a9fe:a9fe", "169.254.169.254", "link-local"),
]


@pytest.mark.parametrize(("address", "carried", "kind"), CARRYING_A_PRIVATE_ONE)
def test_an_ipv6_address_is_judged_by_the_ipv4_it_carries(address, carried, kind):
    why = addresses.address_problem(address)
    assert why.startswith(f"the address is {kind}"), why
    assert carried in why or address.startswith("::ffff:c0a8"), why  # mapped: the IPv4 written another way


@pytest.mark.parametrize("address", ["64:ff9b::5db8:d822", "64:ff9b:1::5db8:d822", "2a00:1450:4001::5efe:5db8:d822"])
def test_one_carrying_a_public_ipv4_is_as_public_as_that_one(address):
    """Judged, not refused wholesale: a NAT64 network's hosts (DNS64) are fetched."""
    assert addresses.address_problem(address) == ""


@pytest.mark.parametrize(("address", "carried", "kind"), CARRYING_A_PRIVATE_ONE)
def test_a_media_url_at_such_an_address_is_refused_before_any_connection(make_channel, address, carried, kind):
    channel = channel_allowing(make_channel)
    with pytest.raises(FileUnavailable) as refused:
        fetch(channel, f"https://[{address}]/boleta.jpg")
    assert refused.value.permanent  # refused by the policy: not a failed connection tried again
    assert str(refused.value).startswith(f"refused: the address is {kind}"), str(refused.value)


# --- images too large to decode (finding 8) -------------------------------------------------

SIDE = 13_000  # 169 Mpx: under Pillow's own refusal (179 Mpx), a byte a pixel at the least once decoded


def huge_png(side=SIDE) -> bytes:
    """A side × side black-and-white PNG (1 bit a pixel): rows of zeros, compressed to
    about 20 KB. Written by hand: Pillow would need the whole image in memory to save it."""
    row, packer = b"\x00" * (1 + (side + 7) // 8), zlib.compressobj(9)
    pixels = b"".join(packer.compress(row) for _ in range(side)) + packer.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)  # bit depth 1, greyscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def peak_memory_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), in MB."""
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


# Past twice the cap Pillow's own guard (set to the cap) refuses it when its header is read.
NOT_SHOWN = "not shown: it is more than 80 Mpx, over the 40 Mpx an image may have to be decoded " \
            "(AGENTLOOP_MEDIA_IMAGE_MAX_PIXELS)"


def test_an_image_too_large_to_decode_is_named_to_the_model_and_its_thumbnail_refused(
        processes, make_channel, fake_telegram, tmp_path):
    """A chat user's photo, through the web server, the worker's fetch from the Bot API
    and the turn's model request: the model is told what was sent and why it does not
    see it; the admin's thumbnail link answers why, as a placeholder image. Neither
    process decodes it (decoded, it is 169 MB at the least)."""
    image = huge_png()
    assert len(image) < 40_000
    with FakeOpenAI() as model:
        web = answered_by_a_model(model, "No puedo verla.", processes, make_channel, fake_telegram, tmp_path)
        worker = processes.started[-1]
        update = photo_update(611, caption="¿qué es esto?")
        update["message"]["photo"] = [{**fake_telegram.add_file(TOKEN, image), "width": SIDE, "height": SIDE}]
        worker_before = peak_memory_mb(worker.pid)
        post(web, update)
        wait_until(settled(611), timeout=30, message="the photo answered")
        [request] = model.requests()
    content = request.messages[-1]["content"]
    assert [part["type"] for part in content] == ["text", "text"], content
    assert content[1]["text"] == f"[photo: image/png, {len(image) / 1000:.0f} KB; {NOT_SHOWN}]"
    assert peak_memory_mb(worker.pid) - worker_before < 60

    file = MediaFile.objects.get()
    assert file.state == MediaState.STORED  # kept: an agent elsewhere may fetch it by its link
    web_before = peak_memory_mb(web.pid)
    thumbnail = local_http.get(f"{web.url}{links.path_for(file.pk)}?thumbnail=1")
    assert thumbnail.status_code == 422
    assert thumbnail.headers["Content-Type"] == "image/svg+xml"
    assert thumbnail.headers["Content-Security-Policy"] == "sandbox; default-src 'none'"
    assert "too large to show: it is more than 80 Mpx, over the 40 Mpx" in thumbnail.text
    assert peak_memory_mb(web.pid) - web_before < 60
    whole = local_http.get(f"{web.url}{links.path_for(file.pk)}")
    assert whole.status_code == 200 and whole.content == image  # the bytes themselves, never decoded here


def test_a_camera_sized_jpeg_is_decoded_at_a_reduced_scale_and_shown(make_channel, settings):
    """The cap is on what would be decoded: a JPEG decodes at 1/2, 1/4 or 1/8 of its size,
    so a 49 Mpx photo (a phone's 48 MP camera) is shown, scaled, and one past twice the
    cap is not opened at all (Pillow's own refusal, Image.MAX_IMAGE_PIXELS, set to the cap)."""
    channel = make_channel("tg", kind="telegram")
    out = io.BytesIO()
    Image.new("L", (7000, 7000), 90).save(out, "JPEG", quality=50)
    photo = stored(channel, "big", out.getvalue())
    [part] = for_agents.parts(for_agents.attachments([photo]))
    shown = Image.open(io.BytesIO(base64.b64decode(part["image_url"]["url"].split(",", 1)[1])))
    assert shown.size == (1568, 1568)

    settings.AGENTLOOP_MEDIA_IMAGE_MAX_PIXELS = 10_000_000  # 7000 × 7000 is past twice this
    [part] = for_agents.parts(for_agents.attachments([photo]))
    assert part["type"] == "text" and "not shown: it is more than 20 Mpx, over the 10 Mpx" in part["text"]


def test_an_image_between_the_cap_and_twice_it_is_named_with_its_size(make_channel, settings):
    channel = make_channel("tg", kind="telegram")
    settings.AGENTLOOP_MEDIA_IMAGE_MAX_PIXELS = 20_000_000
    image = stored(channel, "png", huge_png(5000))
    [part] = for_agents.parts(for_agents.attachments([image]))
    assert part == {"type": "text", "text": f"[photo: image/png, {mb(len(huge_png(5000)))}; not shown: it is "
                                            "5000 × 5000 pixels, over the 20 Mpx an image may have to be decoded "
                                            "(AGENTLOOP_MEDIA_IMAGE_MAX_PIXELS)]"}


# --- backups (finding 10) -------------------------------------------------------------------

def backup_process(processes, path, **env):
    """`manage.py backup PATH` in a process of its own, under umask 022 (what most shells
    have: files everyone may read)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "manage.py", "backup", str(path)], cwd=BASE_DIR, env=processes.env(**env),
                          capture_output=True, text=True, timeout=120, umask=0o022)


def backup_text(path) -> str:
    """What the backup holds, as text: the SQLite file's bytes, or pg_dump's archive as the
    SQL pg_restore makes of it."""
    import shutil
    import subprocess

    if not is_postgres():
        return path.read_bytes().decode("latin-1")
    return subprocess.run([shutil.which("pg_restore"), "-f", "-", str(path)], capture_output=True, text=True,
                          check=True, timeout=60).stdout


def test_a_backup_is_its_owners_alone_and_carries_no_live_session(processes, make_channel, client, tmp_path):
    from django.contrib.auth.models import User
    from django.contrib.sessions.models import Session

    make_channel("tg", kind="telegram", platform_settings={"bot_token": "123456:channel-token-in-the-backup"})
    client.force_login(User.objects.create_superuser("op", "op@example.com", "pw-op-backup-1"))
    [session] = Session.objects.all()
    path = tmp_path / ("db.dump" if is_postgres() else "copy.sqlite3")
    done = backup_process(processes, path)
    assert done.returncode == 0, done.stderr
    assert path.stat().st_mode & 0o777 == 0o600
    held = backup_text(path)
    assert "channel-token-in-the-backup" in held  # what a backup is for: docs/operations.md says so
    assert "django_session" in held and session.session_key not in held
    assert Session.objects.filter(pk=session.pk).exists()  # the live one is untouched


def test_pg_dump_connects_with_every_option_of_the_database_url(processes, tmp_path):
    if not is_postgres():
        pytest.skip("pg_dump is PostgreSQL's (the PostgreSQL pass: tests/conftest.py ONE_PASS)")
    # The suite's server speaks no TLS: an sslmode=require that reaches libpq fails as libpq says.
    done = backup_process(processes, tmp_path / "db.dump", DATABASE_URL=f"{database_url()}?sslmode=require")
    assert done.returncode != 0
    assert "pg_dump failed" in done.stderr and "server does not support SSL, but SSL was required" in done.stderr
    assert not (tmp_path / "db.dump").exists()  # no partial file left behind
