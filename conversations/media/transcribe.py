"""Voice notes and audio files as text, through an OpenAI-compatible
`/v1/audio/transcriptions` (OpenAI's Whisper, a local whisper.cpp or vLLM server…) with
the openai SDK. Done once per file, by the worker that fetched it, before the file is
marked stored: a re-delivered update or a second turn finds the text already there.

Where: the channel's `agent_config["transcription"]` (`base_url`, `model`, `api_key_env`,
`timeout`, `language`; `false` turns it off for that channel), else the deployment's
AGENTLOOP_TRANSCRIPTION_* settings; neither set means voice notes are described to the
model as "not transcribed". A transcription that fails is not retried (the file itself
was fetched): the model is told why it has no text.
"""

from __future__ import annotations

import asyncio
import io
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings

from agentloop.core.redaction import redact
from conversations.agents import key_env_problem
from conversations.media import sniff

if TYPE_CHECKING:
    from conversations.models import Channel, MediaFile

AUDIO_KINDS = ("voice", "audio", "video_note")
TRANSCRIPT_CHARS = 20000


@dataclass(frozen=True)
class Transcriber:
    base_url: str
    model: str
    api_key_env: str
    timeout: float
    language: str = ""


def transcriber_for(channel: Channel) -> Transcriber | None:
    """The transcription server this channel's files go to, or None."""
    own = (channel.agent_config or {}).get("transcription")
    if own is False:
        return None
    own = own if isinstance(own, dict) else {}
    base_url = own.get("base_url") or settings.AGENTLOOP_TRANSCRIPTION_BASE_URL
    if not base_url:
        return None
    return Transcriber(base_url=base_url, model=own.get("model") or settings.AGENTLOOP_TRANSCRIPTION_MODEL,
                       api_key_env=own.get("api_key_env") or settings.AGENTLOOP_TRANSCRIPTION_API_KEY_ENV,
                       timeout=float(own.get("timeout") or settings.AGENTLOOP_TRANSCRIPTION_TIMEOUT),
                       language=str(own.get("language") or ""))


def wanted(file: MediaFile) -> bool:
    return file.kind in AUDIO_KINDS


async def transcribe(transcriber: Transcriber, data: bytes, file_name: str) -> str:
    """The text of this audio (raises on any failure; the caller records why)."""
    # The agent's bounded client cache (its SDK retries off); imported here: the web server
    # imports this module and must not pay for the SDK.
    from conversations.model_clients import client_for

    api_key = os.environ.get(transcriber.api_key_env, "") if not key_env_problem(transcriber.api_key_env) else ""
    client = client_for(transcriber.base_url, api_key or "not-needed", transcriber.timeout)
    upload = io.BytesIO(data)
    upload.name = file_name or "voice.ogg"  # the server reads the format from the name's suffix
    extra: dict[str, Any] = {"language": transcriber.language} if transcriber.language else {}
    # One deadline for the whole exchange (the SDK's timeout is per phase).
    result = await asyncio.wait_for(
        client.audio.transcriptions.create(model=transcriber.model, file=upload, **extra), transcriber.timeout)
    return (getattr(result, "text", None) or str(result or "")).strip()[:TRANSCRIPT_CHARS]


async def transcript_of(file: MediaFile, data: bytes) -> dict[str, str]:
    """The fields to store with a fetched file: its transcript, or why it has none."""
    transcriber = transcriber_for(file.channel) if wanted(file) else None
    if transcriber is None:
        return {}
    try:
        text = await transcribe(transcriber, data, file.file_name or _name_for(file, sniff.content_type(data)))
    except TimeoutError:
        return {"transcript": "", "problem": f"not transcribed: no answer within {transcriber.timeout:g} s"}
    except Exception as exc:  # the SDK's errors, the server's answer: the file is still stored
        why = redact(f"{type(exc).__name__}: {exc}")[:250]
        return {"transcript": "", "problem": f"not transcribed: {why}"}
    return {"transcript": text, "problem": "" if text else "not transcribed: the transcription was empty"}


def _name_for(file: MediaFile, content_type: str) -> str:
    """A file name for the upload: servers pick the decoder by its suffix."""
    suffix = {"audio/ogg": "ogg", "audio/mpeg": "mp3", "audio/mp4": "m4a", "audio/x-wav": "wav",
              "audio/wav": "wav", "video/mp4": "mp4", "audio/webm": "webm"}.get(content_type, "ogg")
    return f"{file.kind}.{suffix}"
