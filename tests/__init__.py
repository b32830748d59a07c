"""agentloop's tests, benchmarks and fault drills: a checkout on the machine that runs them,
so a SECRET_KEY is generated into var/secret_key when none is set (as `make run` does),
for this process and every one it starts."""

import os

os.environ.setdefault("AGENTLOOP_LOCAL_SECRET_KEY", "true")
