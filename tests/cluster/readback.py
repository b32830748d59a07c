"""What the cluster's database says, read in plain SQL over the bridge (the test process
is not one of the hosts, and its own Django database is another one): messages and the
turns they went into, ledger rows, the guard's claims, calendar events, and — from a
host's death on — how long until what it held is another host's."""

import threading
import time
from collections import Counter

import psycopg

QUERY_TIMEOUT_MS = 5000


def connect(url):
    return psycopg.connect(url, autocommit=True, connect_timeout=5,
                           options=f"-c statement_timeout={QUERY_TIMEOUT_MS}")


class Readback:
    def __init__(self, url, slug):
        self.url, self.slug = url, slug

    def rows(self, sql, params=()):
        with connect(self.url) as conn:
            return conn.execute(sql, params).fetchall()

    def channel_id(self):
        return self.rows("SELECT id FROM conversations_channel WHERE slug = %s", (self.slug,))[0][0]

    def messages(self):
        """platform id -> (disposition, turn id, turn state) of every admitted message."""
        found = self.rows(
            """SELECT m.platform_message_id, m.disposition, t.id, t.state
               FROM conversations_inboundmessage m
               LEFT JOIN conversations_turn t ON t.buffer_id = m.buffer_id
               WHERE m.channel_id = %s""", (self.channel_id(),))
        return {platform_id: (disposition, turn, state) for platform_id, disposition, turn, state in found}

    def unsettled(self):
        """Work not finished yet: open buffers, turns ready or running, ledger rows not final."""
        channel = self.channel_id()
        [(buffers, turns, rows)] = self.rows(
            """SELECT
                 (SELECT count(*) FROM conversations_messagebuffer b JOIN conversations_conversation c
                    ON c.id = b.conversation_id WHERE c.channel_id = %(c)s AND b.state = 'open'),
                 (SELECT count(*) FROM conversations_turn t JOIN conversations_conversation c
                    ON c.id = t.conversation_id WHERE c.channel_id = %(c)s AND t.state IN ('ready', 'running')),
                 (SELECT count(*) FROM delivery_outboundmessage
                    WHERE channel_id = %(c)s AND state IN ('pending', 'attempting', 'failed'))""", {"c": channel})
        return {"open_buffers": buffers, "active_turns": turns, "open_ledger_rows": rows}

    def ledger_rows(self):
        """(chat, text) -> how many ledger rows hold that reply."""
        return Counter(self.rows("SELECT chat_id, text FROM delivery_outboundmessage WHERE channel_id = %s",
                                 (self.channel_id(),)))

    def ledger_states(self):
        return dict(self.rows("SELECT state, count(*) FROM delivery_outboundmessage WHERE channel_id = %s "
                              "GROUP BY state", (self.channel_id(),)))

    def turn_states(self):
        return dict(self.rows(
            """SELECT t.state, count(*) FROM conversations_turn t JOIN conversations_conversation c
               ON c.id = t.conversation_id WHERE c.channel_id = %s GROUP BY t.state""", (self.channel_id(),)))

    def duplicate_effects(self):
        """The guard's actions carried out more than once per key, and calendar events made
        more than once (the effect itself, counted where it lands)."""
        claims = self.rows(
            """SELECT scope, action, fingerprint, count(*) FROM tools_actionclaim
               WHERE state = 'done' AND action = 'calendar_create_event'
               GROUP BY scope, action, fingerprint HAVING count(*) > 1""")
        events = self.rows(
            """SELECT calendar_id, title, start, count(*) FROM tools_calendarevent
               GROUP BY calendar_id, title, start HAVING count(*) > 1""")
        return {"claims_done_twice": len(claims), "events_made_twice": len(events)}

    def effects(self):
        [(claims, events, duplicates_caught)] = self.rows(
            """SELECT (SELECT count(*) FROM tools_actionclaim WHERE action = 'calendar_create_event'
                        AND state = 'done'),
                      (SELECT count(*) FROM tools_calendarevent),
                      (SELECT coalesce(sum(duplicates_caught), 0) FROM tools_actionclaim)""")
        return {"claims_done": claims, "events": events, "duplicates_caught": int(duplicates_caught)}

    def let_go(self, host):
        """Turns a worker on `host` held and let go of, or had taken from it as dead (an
        outage): given up to be run again, or failed with the notice as they had fired an
        effect; by the host that ran them in the end."""
        found = self.rows(
            """SELECT e.kind, split_part(t.owner, ':', 1), count(*) FROM audit_auditevent e
               JOIN conversations_turn t ON e.target = 'turn ' || t.id
               WHERE e.actor LIKE %s
                 AND (e.kind = 'turn_recovered' OR (e.kind = 'turn_failed' AND e.summary LIKE '%%let go%%'))
               GROUP BY 1, 2""", (f"{host}:%",))
        let_go = Counter()
        for kind, owner, n in found:  # a failed turn keeps the stamp of the worker that let go
            let_go[f"run again by {owner or '?'}" if kind == "turn_recovered" else "failed with a notice"] += n
        return dict(let_go)

    def flush_lateness(self, phases):
        """Per phase ({name: (start, end)}, wall times): how late the buffers due in it were
        flushed, after their deadlines, p50 and max in seconds."""
        channel = self.channel_id()
        late = {}
        for name, (start, end) in phases.items():
            [(p50, worst, n)] = self.rows(
                """SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM b.flushed_at - b.flush_at)),
                          max(extract(epoch FROM b.flushed_at - b.flush_at)), count(*)
                   FROM conversations_messagebuffer b JOIN conversations_conversation c ON c.id = b.conversation_id
                   WHERE c.channel_id = %s AND b.state = 'flushed'
                     AND b.flush_at >= to_timestamp(%s) AND b.flush_at < to_timestamp(%s)""",
                (channel, start, end))
            late[name] = {"buffers": n, "p50": round(float(p50), 2) if p50 is not None else None,
                          "max": round(float(worst), 2) if worst is not None else None}
        return late

    def buffer_lateness(self, buffer_ids, since, dead=()):
        """Of buffers open at `since` (wall time) and not flushed by a `dead` worker before
        it died: the latest flush after its deadline (or after `since`, for a deadline
        before it), seconds, and who flushed them."""
        found = [(seconds, by) for seconds, by in self.rows(
            """SELECT extract(epoch FROM flushed_at - greatest(flush_at, to_timestamp(%s))), flushed_by
               FROM conversations_messagebuffer WHERE id = ANY(%s)""", (since, list(buffer_ids)))
            if worker(by) not in dead]
        late = [float(seconds) for seconds, _ in found if seconds is not None]
        return (max(late) if late else None), Counter(by.split(":")[0] for _, by in found if by)


def worker(owner):
    """The worker behind an owner stamp (host:pid:start:random[:L]), without the
    per-thread suffix some claims carry (#N)."""
    return (owner or "").split("#")[0]


class Takeover:
    """From the moment `host` died: what it held (running turns, ledger rows it was
    sending or had still to send, open buffers of its conversations) and how many seconds
    until none of it is still waiting on it."""

    def __init__(self, readback, host, chats):
        self.db, self.host, self.chats = readback, host, [str(c) for c in chats]
        self.killed_at = None
        self.turns, self.rows, self.buffers = [], [], []
        self.dead = set()  # the owner stamps of the host's workers at the kill
        self.seconds = {"turns": None, "ledger": None}
        self.taken_by = {}
        self._stop = threading.Event()
        self._thread = None

    def snapshot(self):
        """What the host holds, read just before it is killed: once it is dead the others
        may take it over faster than a look after the kill could see it. What it still
        finished itself before it died is left out afterwards (`finish`)."""
        mine = f"{self.host}:%"
        turns = self.db.rows("SELECT id, owner FROM conversations_turn WHERE state = 'running' AND owner LIKE %s",
                             (mine,))
        rows = self.db.rows(
            """SELECT o.id, coalesce(nullif(o.owner, ''), t.owner) FROM delivery_outboundmessage o
               LEFT JOIN conversations_turn t ON t.id = o.turn_id
               WHERE (o.state = 'attempting' AND o.owner LIKE %s)
                  OR (o.state = 'pending' AND t.owner LIKE %s)""", (mine, mine))
        self.turns, self.rows = [t for t, _ in turns], [r for r, _ in rows]
        self.dead = {worker(owner) for _, owner in turns + rows}
        self.buffers = [r[0] for r in self.db.rows(
            """SELECT b.id FROM conversations_messagebuffer b JOIN conversations_conversation c
               ON c.id = b.conversation_id WHERE b.state = 'open' AND c.chat_id = ANY(%s)""", (self.chats,))]

    def waiting(self):
        mine = f"{self.host}:%"
        [(turns, rows)] = self.db.rows(
            """SELECT
                 (SELECT count(*) FROM conversations_turn WHERE id = ANY(%(t)s)
                    AND (state = 'ready' OR (state = 'running' AND owner LIKE %(m)s))),
                 (SELECT count(*) FROM delivery_outboundmessage WHERE id = ANY(%(r)s)
                    AND (state IN ('pending', 'failed') OR (state = 'attempting' AND owner LIKE %(m)s)))""",
            {"t": self.turns, "r": self.rows, "m": mine})
        return {"turns": turns, "ledger": rows}

    def killed(self, at):
        self.killed_at = at

    def watch(self, timeout):
        """Poll (every 0.1 s) in a thread until nothing waits on the dead host or `timeout`."""
        def loop():
            deadline = time.time() + timeout
            while not self._stop.is_set() and time.time() < deadline:
                try:
                    waiting = self.waiting()
                except psycopg.Error:
                    time.sleep(0.1)
                    continue
                now = time.time()
                for kind, count in waiting.items():
                    if count == 0 and self.seconds[kind] is None:
                        self.seconds[kind] = now - self.killed_at
                if all(v is not None for v in self.seconds.values()):
                    return
                time.sleep(0.1)

        self._thread = threading.Thread(target=loop, name="takeover-watch", daemon=True)
        self._thread.start()

    def finish(self):
        self._stop.set()
        if self._thread:
            self._thread.join(10)
        # Finished or sent under the dead worker's own stamp: it did so before it died.
        done_before = {t for t, state, owner in self.db.rows(
            "SELECT id, state, owner FROM conversations_turn WHERE id = ANY(%s)", (self.turns,))
            if state == "done" and worker(owner) in self.dead}
        sent_before = {r for r, state, owner in self.db.rows(
            "SELECT id, state, owner FROM delivery_outboundmessage WHERE id = ANY(%s)", (self.rows,))
            if state == "delivered" and worker(owner) in self.dead}
        self.turns = [t for t in self.turns if t not in done_before]
        self.rows = [r for r in self.rows if r not in sent_before]
        for kind, held in (("turns", self.turns), ("ledger", self.rows)):
            if not held:
                self.seconds[kind] = None  # nothing of that kind to take over
        turns = self.db.rows("SELECT state, owner FROM conversations_turn WHERE id = ANY(%s)", (self.turns,))
        rows = self.db.rows("SELECT owner FROM delivery_outboundmessage WHERE id = ANY(%s)", (self.rows,))
        # A turn that had fired its effect is never run again: it fails (its owner stamp
        # stays the dead worker's) and the user gets the recovery notice.
        self.taken_by = {"turns run again": Counter(o.split(":")[0] for state, o in turns if state != "failed"),
                         "turns failed with a notice": sum(1 for state, _ in turns if state == "failed"),
                         "ledger rows sent": Counter(o.split(":")[0] for (o,) in rows if o)}
