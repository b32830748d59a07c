"""`manage.py createuser NAME --role operator|auditor`: a person who logs into the admin.
Re-running it updates the user (role, password, email)."""

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from agentloop.console import roles


class Command(BaseCommand):
    help = "Create or update an admin user with one role: operator (runs everything) or auditor (reads history)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="Username.")
        parser.add_argument("--role", required=True, help="operator or auditor.")
        parser.add_argument("--password", help="Default: unchanged for an existing user; generated and printed "
                                               "once for a new one.")
        parser.add_argument("--email", help="Email address.")

    def handle(self, *args: Any, name: str, role: str, password: str | None, email: str | None,
               **options: Any) -> None:
        name, role = name.strip(), role.strip().lower()
        if not name:
            raise CommandError("the user name is empty")
        if role not in roles.ROLES:
            raise CommandError(f"unknown role {role!r}: choose {' or '.join(roles.ROLES)}")
        User = get_user_model()
        try:
            User._meta.get_field(User.USERNAME_FIELD).run_validators(name)  # type: ignore[union-attr]  # a field, not a relation
        except ValidationError as exc:
            raise CommandError(f"bad user name {name!r}: {' '.join(exc.messages)}") from None
        if password is not None and not password:
            raise CommandError("the password is empty")
        with transaction.atomic():
            roles.ensure_roles()
            lookup: dict[str, Any] = {User.USERNAME_FIELD: name}
            user, created = User.objects.get_or_create(**lookup)
            generated = None
            if password is None and (created or not user.has_usable_password()):
                password = generated = secrets.token_urlsafe(12)
            if password is not None:
                user.set_password(password)
            if email is not None:
                user.email = email
            user.is_staff, user.is_superuser = True, False
            user.save()
            user.user_permissions.clear()  # the role alone says what they may do
            user.groups.remove(*Group.objects.filter(name__in=roles.ROLES.values()))
            user.groups.add(Group.objects.get(name=roles.ROLES[role]))
        self.stdout.write(f"{'created' if created else 'updated'} {role} {name!r}")
        if generated:
            self.stdout.write(f"password: {generated}  (shown once)")
