"""The web process: daphne, with its access log's URLs masked (agentloop.core.access_log).

    python -m agentloop.daphne_server <daphne's own arguments>

Daphne writes each request's line (`--verbosity 1`, its default, or `--access-log`)
straight to a stream, outside logging and its redacting record factory, with the URL
whole: a WhatsApp handshake's `hub.verify_token`, a calendar's feed token. The Procfile,
`manage.py runall` and the tests start the web server through this module.
"""

from daphne.access import AccessLogGenerator
from daphne.cli import CommandLineInterface
from daphne.server import Server

from agentloop.core.access_log import masked_url


class MaskedAccessLog(AccessLogGenerator):
    def __call__(self, protocol, action, details):
        super().__call__(protocol, action, {**details, "path": masked_url(str(details.get("path", "")))})


class MaskedLogServer(Server):
    def __init__(self, *args, action_logger=None, **kwargs):
        if isinstance(action_logger, AccessLogGenerator):
            action_logger = MaskedAccessLog(action_logger.stream)
        super().__init__(*args, action_logger=action_logger, **kwargs)


class WebServer(CommandLineInterface):
    server_class = MaskedLogServer


if __name__ == "__main__":
    WebServer.entrypoint()
