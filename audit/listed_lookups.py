"""The audited admin pages accept only the lookups they offer.

Django's admin lets a URL filter a changelist by any lookup on the model's own fields:
`?last_error__regex=…`, `?summary__startswith=…`, `?extra__contains=…`. Whoever may view
the page (an auditor, agentloop.console.roles) could then read a stored text one
character at a time, texts the page deliberately leaves out of its search, and on SQLite
`__regex` runs Python's `re` in the web process. These pages accept their listed filters
(`list_filter`, `date_hierarchy`) with the parameters Django's filters use, and the few
lookups the product's own links carry (`linked_lookups`); anything else is
DisallowedModelAdminLookup, a 400.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib.admin import SimpleListFilter

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin
    from django.http import HttpRequest

    # A mixin of ModelAdmins: its checks see the ModelAdmin it is mixed into.
    _Mixin = ModelAdmin[Any]
else:
    _Mixin = object

# The parameters Django's list filters and date hierarchy put in the URL for a field.
FILTER_SUFFIXES = ("", "__exact", "__isnull", "__id__exact")
DATE_SUFFIXES = ("__year", "__month", "__day", "__gte", "__lt")


class ListedLookupsOnly(_Mixin):
    """A ModelAdmin mixin; `linked_lookups`: the lookups the product's links use."""

    linked_lookups: tuple[str, ...] = ()

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        return lookup in self.listed_lookups() and super().lookup_allowed(lookup, value, request)

    def listed_lookups(self) -> set[str]:
        allowed = set(self.linked_lookups)
        for item in self.list_filter:
            if isinstance(item, type) and issubclass(item, SimpleListFilter):
                if item.parameter_name:  # every filter of ours names its parameter
                    allowed.add(item.parameter_name)
                continue
            name = item[0] if isinstance(item, (list, tuple)) else item
            if isinstance(name, str):  # always, past Django's checks: a bare class is a SimpleListFilter
                allowed.update(name + suffix for suffix in FILTER_SUFFIXES)
        if self.date_hierarchy:
            allowed.update(self.date_hierarchy + suffix for suffix in DATE_SUFFIXES)
        return allowed
