"""Echo's transport: a reply POSTed as JSON, its answer mapped onto the ledger's outcomes."""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx

from delivery.models import Outcome
from delivery.pacing import Pace
from delivery.transports import LoopClients, SendResult, Target, Transport, outcome_for_http_status

DEADLINE = 10.0  # one send, as a whole
_clients = LoopClients()  # one httpx client per event loop


def _client() -> httpx.AsyncClient:
    return _clients.get()


async def close_clients() -> None:
    await _clients.close()


class EchoTransport(Transport):
    max_units = 2000

    async def send_text(self, target: Target, text: str) -> SendResult:
        url = self.channel.setting("reply_url")
        body = {"chat": target.chat_id, "text": text}
        response = await self.exchange(lambda extensions: _client().post(url, json=body, extensions=extensions),
                                       urlsplit(url).netloc, DEADLINE)
        if isinstance(response, SendResult):
            return response  # not sent, or ambiguous: the exchange says which
        outcome = outcome_for_http_status(response.status_code)
        if outcome == Outcome.DELIVERED:
            return SendResult.delivered(response.json().get("id", ""))
        return self.failed(outcome, f"echo answered {response.status_code}: {response.text[:200]}",
                           retry_after=float(response.headers.get("retry-after") or 0) or None)

    def pace(self, chat_id: str) -> Pace | None:
        return self.paced(f"echo:{self.channel.pk}", chat_id, float(self.channel.setting("chat_interval") or 0))
