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

from django.contrib.admin import SimpleListFilter

# The parameters Django's list filters and date hierarchy put in the URL for a field.
FILTER_SUFFIXES = ("", "__exact", "__isnull", "__id__exact")
DATE_SUFFIXES = ("__year", "__month", "__day", "__gte", "__lt")


class ListedLookupsOnly:
    """A ModelAdmin mixin; `linked_lookups`: the lookups the product's links use."""

    linked_lookups: tuple[str, ...] = ()

    def lookup_allowed(self, lookup, value, request):
        return lookup in self.listed_lookups() and super().lookup_allowed(lookup, value, request)

    def listed_lookups(self) -> set[str]:
        allowed = set(self.linked_lookups)
        for item in self.list_filter:
            if isinstance(item, type) and issubclass(item, SimpleListFilter):
                allowed.add(item.parameter_name)
                continue
            name = item[0] if isinstance(item, (list, tuple)) else item
            allowed.update(name + suffix for suffix in FILTER_SUFFIXES)
        if self.date_hierarchy:
            allowed.update(self.date_hierarchy + suffix for suffix in DATE_SUFFIXES)
        return allowed
