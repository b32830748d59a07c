"""The two roles people log into the admin with.

- **Operators** run the product: every permission of every installed model, through
  their group (they are staff, not superusers).
- **Auditors** read the history and nothing else: the `view_*` permissions of the audit
  trail (with its caught duplicates), the guard's claims and proposals, and the delivery
  ledger, and the metrics (`GET /metrics`: counts, no texts). They never see a channel (bot tokens, webhook and callback secrets, the agent's
  settings) or an agent key.

`ensure_roles()` (re)creates both groups with exactly these permissions; it runs after
every `migrate`, so the permissions of every model exist by then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.apps import apps as global_apps
from django.contrib.auth.management import create_permissions
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import DEFAULT_DB_ALIAS
from django.db.models import Q

if TYPE_CHECKING:
    from django.apps import AppConfig
    from django.apps.registry import Apps
    from django.db.models import QuerySet

OPERATORS = "Operators"
AUDITORS = "Auditors"
ROLES = {"operator": OPERATORS, "auditor": AUDITORS}

# What auditors may view (app_label.ModelName); proxies count as models of their own.
AUDITED_MODELS = [
    "audit.AuditEvent", "audit.CaughtDuplicate",
    "tools.ActionClaim", "tools.Proposal",
    "delivery.OutboundMessage", "delivery.UnreachableChat",
]


def operator_permissions(using: str = DEFAULT_DB_ALIAS) -> QuerySet[Permission]:
    return Permission.objects.using(using).all()


# Besides those: reading the Prometheus metrics (agentloop.console.metrics).
METRICS_PERMISSION = ("agentloop", "view_metrics")


def auditor_permissions(using: str = DEFAULT_DB_ALIAS) -> QuerySet[Permission]:
    models = [global_apps.get_model(label) for label in AUDITED_MODELS]
    types = ContentType.objects.db_manager(using).get_for_models(*models, for_concrete_models=False).values()
    app_label, codename = METRICS_PERMISSION
    return Permission.objects.using(using).filter(
        Q(content_type__in=types, codename__startswith="view_")
        | Q(content_type__app_label=app_label, codename=codename))


def ensure_roles(using: str = DEFAULT_DB_ALIAS) -> None:
    """Create or update both groups; a group holds exactly its role's permissions."""
    for name, permissions in ((OPERATORS, operator_permissions(using)), (AUDITORS, auditor_permissions(using))):
        group, _ = Group.objects.using(using).get_or_create(name=name)
        group.permissions.set(permissions)


def on_post_migrate(sender: AppConfig, using: str = DEFAULT_DB_ALIAS, apps: Apps | None = None, **kwargs: Any) -> None:
    """After `migrate`: make sure every app's permissions exist, then the groups.

    Django creates an app's permissions when its own post_migrate is sent, in the order of
    INSTALLED_APPS; this runs on this app's. So only the apps listed after this one still
    lack theirs (none while it is listed last). Creating them all again here doubled the
    cost of every flush between transactional tests (a post_migrate round each). The
    sender is the core app (`agentloop`: the console app has no models, and Django sends
    post_migrate only to apps that have)."""
    apps = apps or global_apps
    try:
        apps.get_model("auth", "Group")
    except LookupError:
        return  # auth is not migrated (yet)
    configs = list(global_apps.get_app_configs())
    for app_config in configs[configs.index(sender) + 1:]:
        create_permissions(app_config, verbosity=0, using=using, apps=apps)
    ensure_roles(using)
