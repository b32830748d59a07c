"""The other apps' admins in the theme: Django's users and groups, django-axes' lockouts and
django-q's background tasks were registered with Django's plain ModelAdmin; registered again
here as the same class mixed with unfold's, so every admin page looks like the product.
This app comes last in INSTALLED_APPS: theirs are registered by then.

Also the admin's texts those libraries write in English or garble, each said below: a
permission's name, a read-only JSON field (unfold), a lockout row's name (django-axes)."""

import json

import unfold.fields
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.utils.html import format_html
from django.utils.translation import gettext, gettext_noop
from django.utils.translation import gettext_lazy as _
from unfold.admin import ModelAdmin
from unfold.forms import AdminPasswordChangeForm, UserChangeForm, UserCreationForm

admin.site.unregister(User)
admin.site.unregister(Group)


# Django stores a permission's name ("Can add turn") in English when it migrates; the user
# and role pages name each in the reader's language instead.
PERMISSION_ACTIONS = {"add": _("Can add %(name)s"), "change": _("Can change %(name)s"),
                      "delete": _("Can delete %(name)s"), "view": _("Can view %(name)s")}
# Our own permissions' names, for the catalogs (agentloop/core/models.py).
CUSTOM_PERMISSIONS = [gettext_noop("Can read the Prometheus metrics (GET /metrics)")]


def permission_label(permission) -> str:
    """"<app> | <model> | Can add <model>", every part in the reader's language."""
    model = permission.content_type.model_class()
    action = permission.codename.split("_", 1)[0]
    if model is not None and action in PERMISSION_ACTIONS and permission.codename == f"{action}_{model._meta.model_name}":
        name = PERMISSION_ACTIONS[action] % {"name": model._meta.verbose_name}
    else:
        name = gettext(permission.name)
    return f"{permission.content_type} | {name}"


class PermissionsInTheReadersLanguage:
    def formfield_for_manytomany(self, db_field, request, **kwargs):
        field = super().formfield_for_manytomany(db_field, request, **kwargs)
        if db_field.name in ("permissions", "user_permissions") and field is not None:
            field.label_from_instance = permission_label
        return field


@admin.register(User)
class ThemedUserAdmin(PermissionsInTheReadersLanguage, UserAdmin, ModelAdmin):
    # unfold's forms: the password fields drawn in the theme, as its docs prescribe.
    form = UserChangeForm
    add_form = UserCreationForm
    change_password_form = AdminPasswordChangeForm


@admin.register(Group)
class ThemedGroupAdmin(PermissionsInTheReadersLanguage, GroupAdmin, ModelAdmin):
    pass


def _dress_the_rest() -> None:
    for model, model_admin in list(admin.site._registry.items()):
        if isinstance(model_admin, ModelAdmin):
            continue
        themed = type(f"Themed{type(model_admin).__name__}", (type(model_admin), ModelAdmin), {})
        admin.site.unregister(model)
        admin.site.register(model, themed)


_dress_the_rest()


def _readable_json(data, encoder=None):
    """A read-only JSON field as the person wrote it: unfold's own (unfold.utils.prettify_json)
    escapes every letter outside ASCII ("Psicolog\\u00eda" to a Spanish operator) and needs
    pygments. Indented, keys sorted, wrapped inside the page's width."""
    text = json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False, cls=encoder)
    return format_html('<pre class="readable-json" style="white-space: pre-wrap; overflow-wrap: anywhere;">{}</pre>',
                       text)


unfold.fields.prettify_json = _readable_json


# django-axes names its rows in English f-strings (its __str__, read in the lockout pages'
# titles and breadcrumbs): named here in the reader's language instead.
def _failure_name(row) -> str:
    text = gettext("Failed access: user %(user)s on %(at)s from %(ip)s")
    if row.locked_out:
        text = gettext("Failed access: user %(user)s (locked out) on %(at)s from %(ip)s")
    return text % {"user": row.username, "at": f"{row.attempt_time:%Y-%m-%d %H:%M}", "ip": row.ip_address}


def _attempt_name(row) -> str:
    return gettext("Attempted access: %(at)s") % {"at": f"{row.attempt_time:%Y-%m-%d %H:%M}"}


def _log_name(row) -> str:
    return gettext("Access log of %(user)s at %(at)s") % {"user": row.username, "at": f"{row.attempt_time:%Y-%m-%d %H:%M}"}


AccessFailureLog.__str__ = _failure_name
AccessAttempt.__str__ = _attempt_name
AccessLog.__str__ = _log_name
