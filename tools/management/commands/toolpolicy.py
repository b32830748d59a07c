import argparse
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tools import guard, registry
from tools.models import ApprovalMode, ToolPolicy

# --approval: nobody decides ("none"), an operator in the admin or the console
# ("operator"), or the conversation's user in the chat ("user").
APPROVALS = list(ApprovalMode.values)

# option name -> model field; only options given on the command line are changed.
FIELDS = {"enabled": "enabled", "guarded": "guarded", "window": "window_seconds", "max_per_hour": "max_per_hour",
          "timeout": "timeout_seconds"}
OPTION_OF = {field: option.replace("_", "-") for option, field in FIELDS.items()}


def limit(value: str) -> int | None:
    """--max-per-hour: a count, or "none" for no limit."""
    if value.lower() == "none":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number or 'none'") from None


class Command(BaseCommand):
    help = ("Create or update a tool policy and print it (re-running with the same name updates only the options "
            "given); without a name, list all policies.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", nargs="?", help="A registered tool, an MCP server's (<server>__<tool>), or an "
                                                    "existing policy (ext:<key>:<action>).")
        # Unset options are left out of `options` (SUPPRESS): "--max-per-hour none" sets None, so None cannot
        # mean "not given".
        unset: dict[str, Any] = {"default": argparse.SUPPRESS}
        parser.add_argument("--approval", **unset, choices=list(APPROVALS),
                            help="none: calls run; operator: calls become proposals an operator applies or "
                                 "rejects; user: the conversation's user confirms each call in the chat.")
        parser.add_argument("--window", **unset, type=int, metavar="SECONDS",
                            help="An identical call within this time of the first is a duplicate.")
        on_off = parser.add_mutually_exclusive_group()
        on_off.add_argument("--enable", dest="enabled", action="store_const", const=True, **unset,
                            help="Offer and run the tool.")
        on_off.add_argument("--disable", dest="enabled", action="store_const", const=False, **unset,
                            help="Neither offer nor run the tool.")
        parser.add_argument("--guard", dest="guarded", action=argparse.BooleanOptionalAction, **unset,
                            help="Duplicate check for effectful calls on/off.")
        parser.add_argument("--max-per-hour", **unset, type=limit, metavar="N|none",
                            help="Calls one contact may make per hour (proposals count); 'none': no limit.")
        parser.add_argument("--fingerprint", **unset, type=lambda v: [f.strip() for f in v.split(",") if f.strip()],
                            metavar="FIELD,…", help="Argument names that make two calls the same action ('' for "
                                                    "the tool's default: all arguments for MCP tools).")
        parser.add_argument("--timeout", **unset, type=int, metavar="SECONDS",
                            help="A claim in flight longer than this was interrupted (outcome uncertain).")

    def handle(self, *args: Any, name: str | None = None, **options: Any) -> None:
        if name is None:
            self.list_policies()
            return
        policy, created = self.policy_named(name)
        changed = self.apply(policy, options)
        guard.forget_policies()  # other processes see the change within their cache's 2 s
        verb = "created" if created else "updated" if changed else "unchanged:"
        self.stdout.write(f"{verb} tool policy {policy.name}")
        for label, value in describe(policy):
            self.stdout.write(f"  {label + ':':<14} {value}")
        refusing = guard.unconfirmable_channels() if policy.approval == ApprovalMode.USER else []
        if refusing:
            self.stderr.write(f"warning: approval = user is refused on channels whose messages agent keys post (the "
                              f"asker could answer): {', '.join(refusing)}; their calls of {policy.name} fail")

    def policy_named(self, name: str) -> tuple[ToolPolicy, bool]:
        known = name in registry.all_tools()
        existed = ToolPolicy.objects.filter(name=name).exists()
        if not (known or existed):
            tools = ", ".join(sorted(registry.all_tools())) or "none"
            raise CommandError(f"unknown tool {name!r}; registered tools: {tools}")
        guard.policy_for(name)  # creates it with the tool's defaults
        # A row of our own: the guard's cached instance is shared and must not see a half-applied edit.
        return ToolPolicy.objects.get(name=name), not existed

    def apply(self, policy: ToolPolicy, options: dict[str, Any]) -> list[str]:
        changed = [field for option, field in FIELDS.items() if option in options]
        for option, field in FIELDS.items():
            if option in options:
                setattr(policy, field, options[option])
        if "approval" in options:
            policy.approval = options["approval"]
            changed.append("approval")
        if "fingerprint" in options:
            policy.fingerprint_fields = options["fingerprint"]
            changed.append("fingerprint_fields")
        if not changed:
            return []
        try:
            policy.full_clean()
        except ValidationError as exc:
            raise CommandError("; ".join(f"--{OPTION_OF.get(field, field)}: {' '.join(errors)}"
                                         for field, errors in exc.message_dict.items())) from exc
        # Only the fields given: an operator's concurrent edit of another field in the admin survives.
        policy.save(update_fields=[*changed, "updated_at"])
        return changed

    def list_policies(self) -> None:
        guard.ensure_policies()  # every registered tool is listed, even before its first call
        for policy in ToolPolicy.objects.order_by("name"):
            fields = dict(describe(policy))
            self.stdout.write(f"{policy.name:<32} {'enabled' if policy.enabled else 'disabled':<8} guard {fields['guarded']:<4} "
                              f"window {fields['window']:<8} approval {fields['approval']:<9} "
                              f"max/hour {fields['max per hour']:<9} timeout {fields['timeout']}")


def describe(policy: ToolPolicy) -> list[tuple[str, str]]:
    return [
        ("enabled", "on" if policy.enabled else "off"),
        ("guarded", "on" if policy.guarded else "off"),
        ("window", f"{policy.window_seconds} s"),
        ("approval", policy.approval),
        ("max per hour", "no limit" if policy.max_per_hour is None else str(policy.max_per_hour)),
        ("timeout", f"{policy.timeout_seconds} s"),
        ("proposal ttl", f"{policy.approval_ttl_seconds} s"),
        ("fingerprint", policy.fingerprint_description()),
    ]

