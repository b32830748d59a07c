"""One HTTP client for the tests' requests to the local servers they start.

`local_http.get(...)` builds a new client per call, and with it an SSL context that loads the
CA bundle: about 25 ms of CPU, for plain-HTTP loopback requests. Polled in a loop (a web
server's /healthz every 20 ms while it boots) that was half of a test run's CPU. This
client is built once. No keep-alive: each request opens its own connection, as the bare
calls did, so a test that kills a server never sees a pooled connection go stale."""

import httpx

client = httpx.Client(timeout=5.0, limits=httpx.Limits(max_keepalive_connections=0), trust_env=False)

get = client.get
post = client.post
request = client.request
