"""A stdio MCP server's transport whose lines are read capped (issue 51, finding 6).

The SDK's `stdio_client` keeps what the server wrote since its last newline in one string:
a server that writes without a newline grows the worker's memory until it stops. Here
stdout is read as bytes, at most reach.MAX_ANSWER_BYTES per line before it is parsed;
a longer line ends the connection ("bad answer", recorded on the connection's attempt).

The process is started and stopped with the SDK's own helpers (mcp==2.3.0, pinned in
requirements.txt): its environment is the SDK's safe subset (HOME, PATH, …) plus the
server's `env`, never the worker's own (SECRET_KEY, DATABASE_URL, provider keys); stopping
closes stdin, waits, then kills the process group. Only reading stdout is ours.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio
from mcp.client.stdio import (
    _create_platform_compatible_process,
    _drain_stdout,
    _get_executable_command,
    _parse_line,
    _stop_server_process,
    get_default_environment,
)

from tools.mcp import reach

if TYPE_CHECKING:
    from anyio.abc import ByteReceiveStream, ByteSendStream
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
    from mcp.client._transport import TransportStreams
    from mcp.os.win32.utilities import ServerProcess
    from mcp.shared.message import SessionMessage

    from tools.mcp.sdk_client import _Attempt

_FLUSH_SECONDS = 0.5


@asynccontextmanager
async def bounded_stdio(command: list[str], env: dict[str, str],
                        attempt: _Attempt | None) -> AsyncIterator[TransportStreams]:
    """(read stream, write stream) of the command's MCP session; `attempt` records a line too long."""
    process = await _create_platform_compatible_process(
        command=await _get_executable_command(command[0]), args=command[1:],
        env=get_default_environment() | env, errlog=sys.stderr, cwd=None)
    reader_out: MemoryObjectSendStream[SessionMessage | Exception]
    read_stream: MemoryObjectReceiveStream[SessionMessage | Exception]
    write_stream: MemoryObjectSendStream[SessionMessage]
    writer_in: MemoryObjectReceiveStream[SessionMessage]
    reader_out, read_stream = anyio.create_memory_object_stream(0)
    write_stream, writer_in = anyio.create_memory_object_stream(0)
    written = anyio.Event()

    # Spawned with pipes (the SDK's _create_platform_compatible_process): both are there.
    stdin, stdout = process.stdin, process.stdout
    assert stdin is not None and stdout is not None

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_read_lines, process, stdout, reader_out, attempt)
        tasks.start_soon(_write_messages, stdin, writer_in, reader_out, written)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):  # the process must not outlive the connection
                read_stream.close()
                write_stream.close()
                with anyio.move_on_after(_FLUSH_SECONDS):
                    await written.wait()
                await _stop_server_process(process)
            tasks.cancel_scope.cancel()


async def _read_lines(process: ServerProcess, stdout: ByteReceiveStream,
                      reader_out: MemoryObjectSendStream[SessionMessage | Exception], attempt: _Attempt | None) -> None:
    """The server's lines parsed into the session's messages, until a line is too long
    (recorded on `attempt`) or the session or the process goes away."""
    try:
        async with reader_out:
            async for line in _lines(stdout):
                await reader_out.send(_parse_line(line.decode("utf-8", errors="replace")))
    except reach.TooLong:
        if attempt is not None:
            attempt.problem = reach.TOO_LONG
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError):
        pass  # the session or the process went away
    finally:
        await _drain_stdout(process)


async def _write_messages(stdin: ByteSendStream, writer_in: MemoryObjectReceiveStream[SessionMessage],
                          reader_out: MemoryObjectSendStream[SessionMessage | Exception], written: anyio.Event) -> None:
    """The session's messages written to the server, one JSON line each; `written` set at the end."""
    try:
        async with writer_in:
            async for message in writer_in:
                line = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                await stdin.send(line.encode())
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        await reader_out.aclose()
    finally:
        written.set()


async def _lines(stdout: ByteReceiveStream) -> AsyncIterator[bytes]:
    """The lines of `stdout` (bytes, without their newline); TooLong past the cap."""
    held = bytearray()
    while True:
        try:
            chunk = await stdout.receive(65536)
        except anyio.EndOfStream:
            return
        while (end := chunk.find(b"\n")) >= 0:
            if len(held) + end > reach.MAX_ANSWER_BYTES:
                raise reach.TooLong()
            yield bytes(held + chunk[:end])
            held.clear()
            chunk = chunk[end + 1:]
        held += chunk
        if len(held) > reach.MAX_ANSWER_BYTES:
            raise reach.TooLong()
