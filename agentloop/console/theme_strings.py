"""The texts of the admin's theme (django-unfold) that an operator reads, for our catalogs.

unfold ships no Spanish or Portuguese catalog, and Django's own covers only the admin's
words ("Save", "Filter"). Listed here (gettext_noop: nothing runs) so that `makemessages`
keeps them in locale/*/django.po, where they are translated like every other text; gettext
finds them there whichever module asks. Those of unfold's features we do not use (import
and export, the WYSIWYG editor, guardian, simple-history) are left out.
"""

from django.utils.translation import gettext_noop

THEME_STRINGS = [
    # The sidebar and its search.
    gettext_noop("All applications"),
    gettext_noop("Search apps and models..."),
    gettext_noop("Recent searches"),
    gettext_noop("No recent searches"),
    gettext_noop("No results found"),
    gettext_noop("No results matching your query"),
    gettext_noop("Loading more results..."),
    # The user menu: the theme switch, the way back.
    gettext_noop("Dark"),
    gettext_noop("Light"),
    gettext_noop("System"),
    gettext_noop("Return to site"),
    gettext_noop("Go back"),
    # Change lists: search, filters, actions, rows.
    gettext_noop("Type to search"),
    gettext_noop("Filters"),
    gettext_noop("Apply Filters"),
    gettext_noop("Reset filters"),
    gettext_noop("Select action"),
    gettext_noop("Select action to run"),
    gettext_noop("Select all rows"),
    gettext_noop("Run"),
    gettext_noop("More actions"),
    gettext_noop("Expand row"),
    gettext_noop("Collapse"),
    gettext_noop("No data"),
    gettext_noop("Not enough data."),
    gettext_noop("This page yielded into no results. Create a new item or reset your filters."),
    gettext_noop("Previous"),
    gettext_noop("Next"),
    gettext_noop("Date from"),
    gettext_noop("Date to"),
    gettext_noop("From"),
    gettext_noop("To"),
    gettext_noop("Select value"),
    gettext_noop("True"),
    gettext_noop("False"),
    # Change forms and inlines.
    gettext_noop("General"),
    gettext_noop("Add row"),
    gettext_noop("Add new item"),
    gettext_noop("This item will be deleted."),
    gettext_noop("Choose file to upload"),
    gettext_noop("Current file"),
    gettext_noop("Image preview"),
    gettext_noop("Click to cancel"),
    gettext_noop("Toggle password visibility"),
    gettext_noop("Enter an URL"),
    gettext_noop("View traceback"),
    gettext_noop("Edit"),
    gettext_noop("New"),
    # The login and logout pages.
    gettext_noop("Forgotten your password or username?"),
    gettext_noop("You have been successfully logged out from the administration"),
]
