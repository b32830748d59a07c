"""email_send through Django's email framework (SMTP in production, the console under
`make run`). Errors are sorted by what they say about the message: refused before
the data was accepted → it was not sent (the claim is released); the connection lost
while the server held the data → it may have been sent (the claim is uncertain)."""

import smtplib
from email.utils import make_msgid
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import EmailMessage, get_connection
from django.core.validators import validate_email

from tools import fingerprint
from tools.registry import Effect, InvalidArguments, OutcomeUnknown, Tool, ToolCall, ToolError

MAX_RECIPIENTS = 20  # the list form's maxItems, and the string form's count of addresses


class SendEmail(Tool):
    name = "email_send"
    description = "Send an email on the business's behalf."
    parameters = {
        "type": "object",
        "properties": {
            "to": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1,
                                                  "maxItems": MAX_RECIPIENTS}],
                   "description": f"One address, or a list of addresses (at most {MAX_RECIPIENTS})"},
            "subject": {"type": "string", "minLength": 1, "maxLength": 300},
            "body": {"type": "string", "minLength": 1, "maxLength": 100000},
        },
        "required": ["to", "subject", "body"],
        "additionalProperties": False,
    }
    effect = Effect.SEND
    # Anyone who can talk to the bot can ask for an email to anyone: out of the box a
    # person approves each one, and a contact cannot have more than ten an hour proposed
    # or sent (tool policy `email_send` in the admin).
    policy_defaults = {"approval": "operator", "max_per_hour": 10}
    fingerprint_fields = ("to", "subject", "body")
    normalizers = {"to": fingerprint.addresses, "subject": fingerprint.text, "body": fingerprint.digest_of}

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        arguments = super().validate(arguments)
        if len(self.recipients(arguments)) > MAX_RECIPIENTS:  # "a@x, b@y, …" as a string, too
            raise InvalidArguments(f"to: at most {MAX_RECIPIENTS} addresses")
        for address in self.recipients(arguments):
            try:
                validate_email(address)
            except ValidationError:
                raise InvalidArguments(f"to: {address!r} is not an email address") from None
        if not self.recipients(arguments):
            raise InvalidArguments("to: at least one address is required")
        return arguments

    @staticmethod
    def recipients(arguments: dict[str, Any]) -> list[str]:
        to = arguments["to"]
        items = to if isinstance(to, list) else to.replace(";", ",").split(",")
        return [a.strip() for a in items if a.strip()]

    def run(self, call: ToolCall) -> dict[str, Any]:
        arguments = call.arguments
        message_id = make_msgid(idstring=call.idempotency_key or None, domain="agentloop")
        message = EmailMessage(subject=arguments["subject"], body=arguments["body"],
                               from_email=settings.DEFAULT_FROM_EMAIL, to=self.recipients(arguments),
                               headers={"Message-ID": message_id})
        connection = get_connection(fail_silently=False)
        try:
            connection.open()
        except (OSError, smtplib.SMTPException) as exc:
            raise ToolError(f"could not reach the mail server: {exc}") from exc
        try:
            connection.send_messages([message])
        except (smtplib.SMTPRecipientsRefused, smtplib.SMTPSenderRefused, smtplib.SMTPDataError) as exc:
            raise ToolError(f"the mail server refused the message: {exc}") from exc
        except (OSError, smtplib.SMTPException) as exc:
            raise OutcomeUnknown(f"the connection to the mail server failed mid-send: {exc}") from exc
        finally:
            try:
                connection.close()
            except Exception:
                pass
        return {"sent_to": self.recipients(arguments), "subject": arguments["subject"], "message_id": message_id}
