"""The generated SECRET_KEY of a checkout, kept in a file only its owner can read.

Imported by settings, so: standard library only, and no Django.
"""

import os
import secrets
import string
from pathlib import Path

_ALPHABET = string.ascii_letters + string.digits + "!@#$%^&*(-_=+)"

MISSING_SECRET_KEY = (
    "SECRET_KEY is not set. Set it in the environment, the same value on every host (e.g. "
    "python -c 'import secrets; print(secrets.token_urlsafe(50))'): a key made up per host signs "
    "sessions the other hosts refuse. On your own machine, `make run` generates one into "
    "var/secret_key (AGENTLOOP_LOCAL_SECRET_KEY=true), and so does DEBUG=true.")


def read_or_create_secret_key(path: Path) -> str:
    """The key in `path`, created (mode 0600) on first use. Several processes may start
    at once (`make run` starts three): the file appears whole or not at all, and the
    first one written wins."""
    if path.exists():
        _owner_only(path)
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    key = "".join(secrets.choice(_ALPHABET) for _ in range(50))
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # 0600 from the first byte
    try:
        os.write(fd, key.encode())
    finally:
        os.close(fd)
    try:
        os.link(draft, path)  # fails if another process got there first: use theirs
    except FileExistsError:
        key = path.read_text().strip()
    finally:
        draft.unlink(missing_ok=True)
    return key


def write_private(path: Path, text: str) -> None:
    """`text` into `path`, readable by its owner only from the first byte: written to a new
    file created 0600 (whatever the umask), then renamed over the old one. Rewriting the
    old file in place would hand the new text to anyone who opened it while its mode was
    wider, and a mode fixed after writing leaves a moment when it is."""
    path.parent.mkdir(parents=True, exist_ok=True)
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a draft left behind by a crashed run keeps its mode otherwise
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(draft, path)


def create_private(path: Path) -> int:
    """A new, empty file at `path`, readable by its owner only from its first byte (0600,
    whatever the umask), open for writing: its descriptor. FileExistsError when anything
    is there already (a symbolic link included: never followed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)  # a umask such as 0277 takes the owner's own write away: 0600 plainly
    return fd


def _owner_only(path: Path) -> None:
    """A key file written by an older version with the umask's mode is tightened."""
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        try:
            os.chmod(path, mode & 0o700)
        except PermissionError:
            pass  # not ours to change; still readable, so still usable
