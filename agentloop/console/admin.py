"""The other apps' admins in the theme: Django's users and groups, django-axes' lockouts and
django-q's background tasks were registered with Django's plain ModelAdmin; registered again
here as the same class mixed with unfold's, so every admin page looks like the product.
This app comes last in INSTALLED_APPS: theirs are registered by then.

Also the admin's texts those libraries write in English or garble, each said below: a
permission's name, a read-only JSON field (unfold), a lockout row's name (django-axes)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import unfold.fields  # type: ignore[import-untyped]  # unfold has no types
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, Permission, User
from django.utils.html import format_html
from django.utils.translation import gettext, gettext_noop
from django.utils.translation import gettext_lazy as _

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin
    from django.contrib.auth.forms import AdminPasswordChangeForm, UserChangeForm, UserCreationForm
    from django.db.models import ManyToManyField
    from django.forms import ModelMultipleChoiceField
    from django.http import HttpRequest
    from django.utils.safestring import SafeString

    # unfold has no types: its ModelAdmin and forms are Django's with a theme.
    _Mixin = ModelAdmin[Any]
    _Themed = ModelAdmin[Any]
    _UserAdmin = UserAdmin[User]
    Theme: type  # unfold's ModelAdmin itself: the admins not yet themed are Django's
else:
    from unfold.admin import ModelAdmin as Theme
    from unfold.forms import AdminPasswordChangeForm, UserChangeForm, UserCreationForm

    _Mixin, _Themed, _UserAdmin = object, Theme, UserAdmin

admin.site.unregister(User)
admin.site.unregister(Group)


# Django stores a permission's name ("Can add turn") in English when it migrates; the user
# and role pages name each in the reader's language instead.
PERMISSION_ACTIONS = {"add": _("Can add %(name)s"), "change": _("Can change %(name)s"),
                      "delete": _("Can delete %(name)s"), "view": _("Can view %(name)s")}
# Our own permissions' names, for the catalogs (agentloop/core/models.py).
CUSTOM_PERMISSIONS = [gettext_noop("Can read the Prometheus metrics (GET /metrics)")]


def permission_label(permission: Permission) -> str:
    """"<app> | <model> | Can add <model>", every part in the reader's language."""
    model = permission.content_type.model_class()
    action = permission.codename.split("_", 1)[0]
    if model is not None and action in PERMISSION_ACTIONS and permission.codename == f"{action}_{model._meta.model_name}":
        name = PERMISSION_ACTIONS[action] % {"name": model._meta.verbose_name}
    else:
        name = gettext(permission.name)
    return f"{permission.content_type} | {name}"


class PermissionsInTheReadersLanguage(_Mixin):
    def formfield_for_manytomany(self, db_field: ManyToManyField[Any, Any], request: HttpRequest,
                                 **kwargs: Any) -> ModelMultipleChoiceField[Any] | None:
        field = super().formfield_for_manytomany(db_field, request, **kwargs)
        if db_field.name in ("permissions", "user_permissions") and field is not None:
            field.label_from_instance = permission_label  # type: ignore[method-assign,assignment]  # Django's way
        return field


@admin.register(User)
class ThemedUserAdmin(PermissionsInTheReadersLanguage, _UserAdmin, _Themed):
    # unfold's forms: the password fields drawn in the theme, as its docs prescribe.
    form = UserChangeForm
    add_form = UserCreationForm
    change_password_form = AdminPasswordChangeForm


@admin.register(Group)
class ThemedGroupAdmin(PermissionsInTheReadersLanguage, GroupAdmin, _Themed):  # type: ignore[misc]  # GroupAdmin: request=None
    pass


def _dress_the_rest() -> None:
    for model, model_admin in list(admin.site._registry.items()):
        if isinstance(model_admin, Theme):
            continue
        themed = type(f"Themed{type(model_admin).__name__}", (type(model_admin), Theme), {})
        admin.site.unregister(model)
        admin.site.register(model, themed)


_dress_the_rest()


def _readable_json(data: Any, encoder: type[json.JSONEncoder] | None = None) -> SafeString:
    """A read-only JSON field as the person wrote it: unfold's own (unfold.utils.prettify_json)
    escapes every letter outside ASCII ("Psicolog\\u00eda" to a Spanish operator) and needs
    pygments. Indented, keys sorted, wrapped inside the page's width."""
    text = json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False, cls=encoder)
    return format_html('<pre class="readable-json" style="white-space: pre-wrap; overflow-wrap: anywhere;">{}</pre>',
                       text)


unfold.fields.prettify_json = _readable_json


# django-axes names its rows in English f-strings (its __str__, read in the lockout pages'
# titles and breadcrumbs): named here in the reader's language instead.
def _failure_name(row: AccessFailureLog) -> str:
    text = gettext("Failed access: user %(user)s on %(at)s from %(ip)s")
    if row.locked_out:
        text = gettext("Failed access: user %(user)s (locked out) on %(at)s from %(ip)s")
    return text % {"user": row.username, "at": f"{row.attempt_time:%Y-%m-%d %H:%M}", "ip": row.ip_address}


def _attempt_name(row: AccessAttempt) -> str:
    return gettext("Attempted access: %(at)s") % {"at": f"{row.attempt_time:%Y-%m-%d %H:%M}"}


def _log_name(row: AccessLog) -> str:
    return gettext("Access log of %(user)s at %(at)s") % {"user": row.username, "at": f"{row.attempt_time:%Y-%m-%d %H:%M}"}


AccessFailureLog.__str__ = _failure_name
AccessAttempt.__str__ = _attempt_name
AccessLog.__str__ = _log_name
