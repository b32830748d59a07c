"""A process that calls one tool behind the guard from N threads at once, as a worker's
tool threads would: `python -m tests.support.mcp_callers NAME ARGS_JSON CONVERSATION N START_AT`.
Each thread waits for the wall clock's START_AT, calls `guard.invoke`, and the statuses
are printed as one JSON line."""

import json
import sys
import threading
import time

import django


def main():
    django.setup()
    from django.db import connections

    from conversations.models import Conversation
    from tools import guard
    from tools.registry import Scope

    name, arguments, conversation_id, count, start_at = sys.argv[1:6]
    scope = Scope.of_conversation(Conversation.objects.select_related("channel", "contact").get(pk=conversation_id))
    statuses = []

    def call():
        try:
            time.sleep(max(0.0, float(start_at) - time.time()))
            statuses.append(guard.invoke(name, json.loads(arguments), scope, actor="test-caller").status)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=call) for _ in range(int(count))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    print(json.dumps(statuses), flush=True)


if __name__ == "__main__":
    main()
