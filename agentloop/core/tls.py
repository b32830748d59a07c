"""One TLS context per process for the short-lived HTTP clients (callbacks, webhook agents).

httpx builds a new SSLContext for every client, loading the whole CA bundle: ~70 ms of
CPU each. A worker POSTing 20 callback replies a second spent more than a core on it,
its event loop fell behind, and the sends' deadlines expired (the soak benchmark found
it). An SSLContext is safe to share between clients and threads.
"""

import functools
import ssl

import certifi


@functools.cache
def shared_tls_context() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=certifi.where())


@functools.cache
def tls_context_trusting(cafile: str) -> ssl.SSLContext:
    """The public CAs and those in `cafile` too (a PEM bundle: an internal CA, a test's
    self-signed certificate); one context per bundle."""
    context = ssl.create_default_context(cafile=certifi.where())
    context.load_verify_locations(cafile=cafile)
    return context
