"""One HTTP download with an overall deadline and a size cap, read as a stream: a
server that trickles bytes meets the deadline, one that sends more than it announced
(or more than the cap) is cut off at the cap, not read to the end."""

import asyncio

import httpx

from agentloop.core.redaction import redact
from agentloop.core.tls import shared_tls_context


class FileUnavailable(Exception):
    """The platform will not give the file: `permanent` (404, refused) or worth another try."""

    def __init__(self, why: str, permanent: bool = False):
        super().__init__(why)
        self.permanent = permanent


class FileTooLarge(FileUnavailable):
    def __init__(self, size: int, limit: int):
        super().__init__(f"{mb(size)} is over the {mb(limit)} a file may have", permanent=True)
        self.size, self.limit = size, limit


def mb(size: int) -> str:
    if size >= 100_000:
        return f"{size / 1_000_000:.1f} MB"
    return f"{size / 1000:.0f} KB" if size >= 1000 else f"{size} bytes"


async def fetch_bytes(url: str, limit: int, deadline: float, headers: dict[str, str] | None = None,
                      secrets: tuple[str, ...] = ()) -> bytes:
    """GET `url`, at most `limit` bytes, within `deadline` seconds in all. `secrets`
    (a token in the URL, a bearer) are masked in every error text."""
    try:
        return await asyncio.wait_for(_read(url, limit, deadline, headers or {}), deadline)
    except TimeoutError:
        raise FileUnavailable(f"the download did not finish within {deadline:g} s") from None
    except httpx.HTTPError as exc:
        raise FileUnavailable(redact(f"the download failed: {type(exc).__name__}: {exc}", list(secrets))) from None


async def _read(url: str, limit: int, deadline: float, headers: dict[str, str]) -> bytes:
    # The process's one TLS context (agentloop.core.tls): httpx's own is a new one per client,
    # the CA bundle loaded again (~70 ms of CPU, ~0.9 MB of OpenSSL's memory each, held by the
    # closed client's reference cycles until the worker's rare full collections: 10 MB an album).
    async with httpx.AsyncClient(timeout=deadline, follow_redirects=False, verify=shared_tls_context()) as client:
        async with client.stream("GET", url, headers=headers) as response:
            return await read_body(response, limit)


async def read_body(response: httpx.Response, limit: int, who: str = "the platform") -> bytes:
    """A streamed response's body, at most `limit` bytes (FileTooLarge past it, whatever
    Content-Length said); a status other than 200 is FileUnavailable (`permanent` for
    401, 403, 404, 410)."""
    if response.status_code in (401, 403, 404, 410):
        raise FileUnavailable(f"{who} answered {response.status_code} for the file", permanent=True)
    if response.status_code != 200:
        raise FileUnavailable(f"{who} answered {response.status_code} for the file")
    try:
        announced = int(response.headers.get("content-length") or 0)
    except ValueError:  # a server's garbage: the cap is checked while reading all the same
        announced = 0
    if announced > limit:
        raise FileTooLarge(announced, limit)
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > limit:
            raise FileTooLarge(len(body), limit)
    return bytes(body)
