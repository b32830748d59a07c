"""psycopg's pool (DATABASE_POOL) logs every connection it drops and every failed
reconnect while the database is away — several lines a second, each with the server's
multi-line hint. This filter drops the first kind (a dropped connection is how every
outage starts; the worker's fault log reports the outage once, and its end) and lets the
first reconnect failure of a kind through (it names the cause: a wrong database name,
refused connections), then one of that kind every REPORT_EVERY seconds."""

import logging
import threading
import time

REPORT_EVERY = 30.0
ROUTINE = ("discarding closed connection",)


class OncePerKind(logging.Filter):
    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}  # bounded below

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(ROUTINE):
            return False
        kind = message[:40]  # "error connecting in 'pool-1': connection…": addresses and hints vary after
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(kind, -REPORT_EVERY) < REPORT_EVERY:
                return False
            if len(self._last) > 100:
                self._last.clear()
            self._last[kind] = now
        return True
