"""One flush run of tests.bench.grown, in a process set on the database it measures
(DATABASE_URL): the flush benchmark's bursts (tests.bench.__main__.flush_lateness) into
the `bench-api` channel tests.bench.prefill made, a worker running; prints one JSON line.

    DATABASE_URL=… .venv/bin/python -m tests.bench.grown_flush TAG
"""

import json
import os
import sys


def main(tag):
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentloop.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from conversations.models import Channel
    from tests.bench import __main__ as kit

    kit.LOGS.mkdir(parents=True, exist_ok=True)
    channel = Channel.objects.get(slug="bench-api")
    proc = kit.worker()
    try:
        late, count, lost, double = kit.flush_lateness(channel, tag=tag)
    finally:
        kit.stop(proc)
    print(json.dumps({"p50": kit.percentile(late, 50), "p99": kit.percentile(late, 99), "count": count,
                      "lost": lost, "double": double}))


if __name__ == "__main__":
    main(sys.argv[1])
