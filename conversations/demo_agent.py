"""The `demo` agent: built in, deterministic, no network — so `make run` shows the whole
loop without a model.

It understands a handful of intents in Spanish and English and, like a literal model,
obeys each order, even a repeated one:

- hello ("hola", "hi", "buenas") → a greeting;
- schedule ("agenda", "agéndame", "confirmo", "reserva", "book", "schedule", "confirm")
  with times in the message ("lunes a las 10", "1/12 10:00", "2026-12-01 10:00",
  "mañana a las 9", "tomorrow at 9am") → one `calendar_create_event` per time; with no
  time in the message it takes the times from the conversation so far (that is how the
  incident goes: "Confirmo las horas de psicología: lunes y miércoles a las 10", then
  "Agéndame las horas en mi calendario" creates the same events again — and the guard,
  not this agent, stops the duplicates);
- list ("mis eventos", "mi agenda", "my events", "my calendar") → `calendar_list_events`;
- email ("envía un correo a ana@example.com: asunto … / mensaje …", "email x@y.com
  subject … body …") → `email_send`.

Its limits: it reads only these phrasings, one language per message, times as shown
above (the event title is the word after "de"/"for", else "Cita"/"Appointment"), and it
does not converse. Anything else gets a short help text.
"""

from __future__ import annotations

import re
import unicodedata
from datetime import date, datetime, timedelta

from django.utils import timezone

from conversations.agents import Agent, JsonObject, TurnContext
from tools.fingerprint import default_zone

WEEKDAYS = {
    "lunes": 0, "martes": 1, "miercoles": 2, "jueves": 3, "viernes": 4, "sabado": 5, "domingo": 6,
    "monday": 0, "tuesday": 1, "wednesday": 2, "thursday": 3, "friday": 4, "saturday": 5, "sunday": 6,
}
SCHEDULE = re.compile(r"\b(agend\w*|confirm\w*|reserv\w*|program\w*|book\w*|schedul\w*)\b")
LIST = re.compile(r"\b(mis (eventos|citas)|mi (agenda|calendario)|my (events|calendar|appointments)|que tengo)\b")
EMAIL = re.compile(r"\b(correo|email|e-mail|mail)\b")
HELLO = re.compile(r"^\s*(hola|buenas|buenos dias|buenas tardes|hi|hello|hey)\b")
ADDRESS = re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+")
TIME = r"(?:a las |at |@ ?)?(\d{1,2})(?:[:h.](\d{2}))?\s*(am|pm|hs|h)?"
SPANISH_HINTS = ("hola", "agend", "confirmo", "correo", "mis ", "lunes", "martes", "mañana", "las ", "por favor")


def plain(text: str) -> str:
    """Lower case without accents, for matching."""
    return "".join(c for c in unicodedata.normalize("NFKD", text.lower()) if not unicodedata.combining(c))


def is_spanish(text: str) -> bool:
    lowered = text.lower()
    return any(hint in lowered for hint in SPANISH_HINTS) or any(c in lowered for c in "ñáéíóú¿¡")


def _hour(hour: str, minute: str, suffix: str) -> tuple[int, int]:
    h, m = int(hour), int(minute or 0)
    if suffix == "pm" and h < 12:
        h += 12
    if suffix == "am" and h == 12:
        h = 0
    return h, m


def find_times(text: str, now: datetime) -> list[datetime]:
    """The moments a message names, in order, in the deployment's zone."""
    text = plain(text)
    today = now.astimezone(default_zone()).date()
    found: list[datetime] = []

    def at(day: date, hour: str, minute: str, suffix: str) -> None:
        h, m = _hour(hour, minute, suffix)
        if 0 <= h < 24 and 0 <= m < 60:
            found.append(datetime(day.year, day.month, day.day, h, m, tzinfo=default_zone()))

    for y, mo, d, hour, minute in re.findall(r"(\d{4})-(\d{2})-(\d{2})[t ](\d{1,2}):(\d{2})", text):
        at(datetime(int(y), int(mo), int(d)).date(), hour, minute, "")
    for d, mo, hour, minute, suffix in re.findall(r"\b(\d{1,2})/(\d{1,2})\s+" + TIME, text):
        day = datetime(today.year, int(mo), int(d)).date()
        at(day if day >= today else day.replace(year=day.year + 1), hour, minute, suffix)
    # "lunes y miércoles a las 10", "monday at 9am", "mañana a las 9", "tomorrow at 9"
    for days, hour, minute, suffix in re.findall(
            r"((?:(?:" + "|".join([*WEEKDAYS, "manana", "tomorrow", "hoy", "today"]) + r")(?:,\s*|\s+y\s+|\s+and\s+)?)+)"
            r"\s*(?:a las |at |@ ?)(\d{1,2})(?:[:h.](\d{2}))?\s*(am|pm)?", text):
        for name in re.findall(r"[a-z]+", days):
            if name in ("y", "and"):
                continue
            if name in ("manana", "tomorrow"):
                day = today + timedelta(days=1)
            elif name in ("hoy", "today"):
                day = today
            else:
                day = today + timedelta(days=(WEEKDAYS[name] - today.weekday() - 1) % 7 + 1)
            at(day, hour, minute, suffix)
    return found


def title_of(text: str, spanish: bool) -> str:
    """The word after "de"/"for" ("horas de psicología"), or after the verb ("book physio")."""
    not_titles = {*WEEKDAYS, "manana", "tomorrow", "hoy", "today", "las", "horas", "hora", "cita", "citas", "me",
                  "it", "an", "appointment", "el", "la"}
    for pattern in (r"\b(?:de|del|para|for|with)\s+(?:la |el |las |los |the |my |mi |a |an )?([a-záéíóúñü]{3,})",
                    r"\b(?:book|schedule|agenda|agendame|agéndame|reserva)\s+(?:a |an |la |el |una? )?"
                    r"([a-záéíóúñü]{3,})"):
        for match in re.finditer(pattern, text.lower()):
            if plain(match.group(1)) not in not_titles:
                return match.group(1).capitalize()
    return "Cita" if spanish else "Appointment"


async def _call(ctx: TurnContext, name: str, arguments: JsonObject) -> JsonObject:
    """ctx.call_tool(): the worker gives every turn it runs its tools."""
    assert ctx.call_tool is not None, "a turn's context without call_tool"
    return await ctx.call_tool(name, arguments)


def _time_label(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M")


class DemoAgent(Agent):
    async def respond(self, ctx: TurnContext) -> str:
        text, spanish = ctx.text, is_spanish(ctx.text)
        lowered = plain(text)
        now = timezone.now()
        if EMAIL.search(lowered) and ADDRESS.search(text):
            return await self._email(ctx, text, spanish)
        if SCHEDULE.search(lowered):
            return await self._schedule(ctx, text, spanish, now)
        if LIST.search(lowered):
            return await self._list(ctx, spanish)
        if HELLO.search(lowered):
            return ("¡Hola! Soy el agente de demostración. Puedo agendar citas, mostrar tus eventos y enviar "
                    "correos." if spanish else
                    "Hi! I'm the demo agent. I can schedule appointments, list your events and send emails.")
        return ("Puedo: agendar (\"agéndame psicología el lunes a las 10\"), listar (\"mis eventos\") y enviar "
                "correos (\"envía un correo a ana@example.com: asunto Hola / mensaje …\")." if spanish else
                "I can: schedule (\"book physio on monday at 10\"), list (\"my events\") and send emails "
                "(\"email ana@example.com subject Hello body …\").")

    async def _schedule(self, ctx: TurnContext, text: str, spanish: bool, now: datetime) -> str:
        times = find_times(text, now)
        source = text
        if not times and ctx.load_history is not None:  # "agéndame las horas": the ones said before
            for message in reversed(await ctx.load_history()):
                if message["role"] == "user" and (times := find_times(message["content"], now)):
                    source = message["content"]
                    break
        if not times:
            return ("¿Para qué día y hora? Por ejemplo: \"el lunes a las 10\"." if spanish else
                    "For which day and time? For example: \"on monday at 10\".")
        title = title_of(source, spanish)
        lines = []
        for moment in times:
            result = await _call(ctx, "calendar_create_event",
                                 {"title": title, "start_datetime": moment.isoformat()})
            lines.append(self._outcome_line(result, f"{title} {_time_label(moment)}", spanish))
        return "\n".join(lines)

    @staticmethod
    def _outcome_line(result: JsonObject, what: str, spanish: bool) -> str:
        status = result.get("status")
        if status == "done":
            return f"✅ Agendado: {what}" if spanish else f"✅ Scheduled: {what}"
        if status == "duplicate":
            return f"ℹ️ Ya estaba agendado: {what}" if spanish else f"ℹ️ Already scheduled: {what}"
        if status == "awaiting_approval":
            return f"⏳ Pendiente de aprobación: {what}" if spanish else f"⏳ Awaiting approval: {what}"
        if status in ("in_progress", "uncertain"):
            return f"⚠️ Puede que ya esté hecho: {what}" if spanish else f"⚠️ It may already be done: {what}"
        error = result.get("error", "")
        return f"❌ No se pudo: {what} ({error})" if spanish else f"❌ Could not: {what} ({error})"

    async def _list(self, ctx: TurnContext, spanish: bool) -> str:
        result = await _call(ctx, "calendar_list_events", {})
        events = (result.get("result") or {}).get("events", [])
        if not events:
            return "No tienes eventos próximos." if spanish else "You have no upcoming events."
        heading = "Tus próximos eventos:" if spanish else "Your upcoming events:"
        return "\n".join([heading] + [f"• {e['title']} — {e['start'][:16].replace('T', ' ')}" for e in events])

    async def _email(self, ctx: TurnContext, text: str, spanish: bool) -> str:
        address = ADDRESS.search(text)
        assert address is not None, "respond() sends here only a text with an address"
        to = address.group(0)
        subject_found = re.search(r"(?:asunto|subject)[:\s]+(.+?)(?:\s*/\s*|\s+(?:mensaje|body)[:\s]|$)", text,
                                  re.IGNORECASE)
        body_found = re.search(r"(?:mensaje|body)[:\s]+(.+)$", text, re.IGNORECASE | re.DOTALL)
        subject = subject_found.group(1).strip() if subject_found else ("Mensaje" if spanish else "Message")
        body = body_found.group(1).strip() if body_found else text
        result = await _call(ctx, "email_send", {"to": to, "subject": subject, "body": body})
        return self._outcome_line(result, f"{'correo a' if spanish else 'email to'} {to}: {subject}", spanish)
