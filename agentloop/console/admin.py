"""The other apps' admins in the theme: Django's users and groups, django-axes' lockouts and
django-q's background tasks were registered with Django's plain ModelAdmin; registered again
here as the same class mixed with unfold's, so every admin page looks like the product.
This app comes last in INSTALLED_APPS: theirs are registered by then."""

import json

import unfold.fields
from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.utils.html import format_html
from unfold.admin import ModelAdmin
from unfold.forms import AdminPasswordChangeForm, UserChangeForm, UserCreationForm

admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class ThemedUserAdmin(UserAdmin, ModelAdmin):
    # unfold's forms: the password fields drawn in the theme, as its docs prescribe.
    form = UserChangeForm
    add_form = UserCreationForm
    change_password_form = AdminPasswordChangeForm


@admin.register(Group)
class ThemedGroupAdmin(GroupAdmin, ModelAdmin):
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
