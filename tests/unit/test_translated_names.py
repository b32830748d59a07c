"""No domain word of ours stays English in the admin: every app, model (singular and
plural) and field name of the product's apps, every label of their choices, every help
text, and each platform setting's label and help on the channel form, reads differently
in Spanish and in Portuguese than in English — unless it is one of the few
words both languages write as English does (ID, URL, token…). A field added without a
marked verbose_name, or marked and left out of the catalogs, fails here: Django's
automatic name ("send blocked") is the same in every language. The app registry and the
compiled catalogs only: no database."""

import pytest
from django.apps import apps
from django.conf import settings
from django.db import models
from django.utils import translation

from conversations import platforms
from tests.unit.test_catalogs import APPS

TRANSLATED = ("es", "pt")
# Written as English writes them in Spanish and Brazilian Portuguese alike (case aside).
# Platforms are names (Telegram, Slack…), and each language is named in its own (Español).
SAME_IN_EVERY_LANGUAGE = {"id", "url", "token", "sha-256", "pid", "uid", "emoji", "api",
                          *(platform.label.lower() for platform in platforms.all_platforms()),
                          *(name.lower() for _code, name in settings.LANGUAGES)}
# Brazilian Portuguese's own word for it is the English one.
SAME_IN = {"pt": {"buffer"}}


def our_app_configs():
    """The product's apps (agentloop.core has the label `agentloop`, the console `console`)."""
    return [config for config in apps.get_app_configs() if config.name.split(".")[0] in APPS]


def names_operators_read():
    """(where, the lazy text) of every app, model, field and choice label of our apps."""
    for config in our_app_configs():
        if list(config.get_models()):
            yield f"app {config.label}", config.verbose_name
        for model in config.get_models():
            where = f"{config.label}.{model.__name__}"
            yield f"{where} (singular)", model._meta.verbose_name
            yield f"{where} (plural)", model._meta.verbose_name_plural
            for field in model._meta.get_fields(include_parents=False):
                if field.auto_created and not field.concrete:
                    continue  # a reverse relation: named by the other model's field
                yield f"{where}.{field.name}", field.verbose_name
                for value, label in getattr(field, "flatchoices", None) or ():
                    if value not in ("", None):
                        yield f"{where}.{field.name} = {value!r}", label


def help_operators_read():
    """(where, the lazy text) of every field's help text, and every platform setting's
    label and help (the channel form's own fields)."""
    for config in our_app_configs():
        for model in config.get_models():
            for field in model._meta.get_fields(include_parents=False):
                if getattr(field, "help_text", ""):
                    yield f"{config.label}.{model.__name__}.{field.name} (help)", field.help_text
    for platform in platforms.all_platforms():
        for name, spec in platform.settings.items():
            yield f"{platform.kind} setting {name} (label)", spec.label
            if spec.help:
                yield f"{platform.kind} setting {name} (help)", spec.help


def english_and(language, text) -> tuple[str, str]:
    with translation.override("en"):
        english = str(text)
    with translation.override(language):
        return english, str(text)


def same_word_allowed(language, english) -> bool:
    word = english.lower()
    return word in SAME_IN_EVERY_LANGUAGE or word in SAME_IN.get(language, set())


@pytest.mark.parametrize("language", TRANSLATED)
def test_every_model_field_and_choice_name_is_translated(language):
    untranslated = []
    for where, text in names_operators_read():
        english, translated = english_and(language, text)
        if translated == english and not same_word_allowed(language, english):
            untranslated.append(f"{where}: {english!r}")
    assert not untranslated, (f"English in the {language} admin: mark it (verbose_name=_(…)), run makemessages "
                              f"and translate it (docs/languages.md): {untranslated}")


@pytest.mark.parametrize("language", TRANSLATED)
def test_every_help_text_and_platform_setting_is_translated(language):
    untranslated = [f"{where}: {english!r}" for where, text in help_operators_read()
                    for english, translated in [english_and(language, text)]
                    if translated == english and not same_word_allowed(language, english)]
    assert not untranslated, f"English in the {language} admin: mark and translate it (docs/languages.md): {untranslated}"


def test_the_check_reads_every_kind_of_name():
    """Not vacuous: the apps, models, fields and choices of each of our apps are read, and a
    name Django made up by itself is caught."""
    read = dict(names_operators_read())
    assert {"app conversations", "conversations.Channel (plural)", "delivery.OutboundMessage.state",
            "tools.McpServer.transport = 'stdio'", "audit.AuditEvent.kind = 'duplicate_prevented'",
            "agentloop.LiveEvent.payload"} <= set(read)
    assert english_and("es", read["conversations.Channel (singular)"]) == ("channel", "canal")
    helps = dict(help_operators_read())
    assert {"conversations.Channel.max_wait (help)", "telegram setting bot_token (label)",
            "whatsapp setting api_version (help)"} <= set(helps)
    automatic = models.CharField(max_length=10)
    automatic.set_attributes_from_name("send_blocked")
    english, spanish = english_and("es", automatic.verbose_name)
    assert spanish == english and not same_word_allowed("es", english)
