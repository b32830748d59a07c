"""The local calendar as an iCalendar feed: subscribe to it from any calendar app.
The URL carries the calendar's secret token (shown in the admin)."""

from django.http import Http404, HttpRequest, HttpResponse
from icalendar import Calendar as ICalendar
from icalendar import Event

from tools.models import Calendar


def calendar_feed(request: HttpRequest, token: str) -> HttpResponse:
    calendar = Calendar.objects.filter(feed_token=token).first()
    if calendar is None:
        raise Http404("no such calendar")
    feed = ICalendar()
    feed.add("prodid", "-//agentloop//calendar//EN")
    feed.add("version", "2.0")
    feed.add("x-wr-calname", str(calendar))
    for stored in calendar.events.all():
        event = Event()
        event.add("uid", stored.uid)
        event.add("summary", stored.title)
        event.add("dtstart", stored.start)
        if stored.end:
            event.add("dtend", stored.end)
        event.add("dtstamp", stored.created_at)
        if stored.location:
            event.add("location", stored.location)
        if stored.description:
            event.add("description", stored.description)
        for attendee in stored.attendees:
            event.add("attendee", f"mailto:{attendee}")
        feed.add_component(event)
    response = HttpResponse(feed.to_ical(), content_type="text/calendar; charset=utf-8")
    response["Content-Disposition"] = f'inline; filename="{calendar.feed_token}.ics"'
    return response
