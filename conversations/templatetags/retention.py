"""{% retention_defaults as rows %}: how long each kind of data is kept, for the admin's index."""

from django import template

from conversations import retention

register = template.Library()


@register.simple_tag
def retention_defaults() -> list[tuple[str, str]]:
    return retention.defaults()
