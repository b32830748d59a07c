from tools.builtin.calendar import CreateEvent


class UnguardedCreateEvent(CreateEvent):
    """The same tool under another name, whose policy switches the guard off: the
    reference the guard's overhead is measured against."""

    name = "calendar_create_event_unguarded"
