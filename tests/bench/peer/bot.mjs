// The peer in `make bench` (tests/bench/peer.py): a Vercel Chat SDK 4.41 Telegram bot in
// webhook mode, burst concurrency, whose direct-message handler posts the merged burst
// (`context.skipped` plus the message) back through the adapter. The same workload and
// the same local Bot API server as agentloop's side of the benchmark.
//
// Environment:
//   PEER_PORT                        port to listen on (127.0.0.1)
//   PEER_STATE                       "memory" (default) or "redis"
//   REDIS_URL                        redis://... when PEER_STATE=redis
//   TELEGRAM_BOT_TOKEN               the bot's token
//   TELEGRAM_WEBHOOK_SECRET_TOKEN    checked against X-Telegram-Bot-Api-Secret-Token
//   TELEGRAM_API_BASE_URL            the Bot API root (the local fake)
//   PEER_DEBOUNCE_MS                 burst window; unset = the SDK's default (1500 ms)
//   PEER_LOG_LEVEL                   Chat SDK log level (default "warn": no line per message)
//
// Routes: POST /webhooks/telegram -> bot.webhooks.telegram; GET /healthz -> 200 once the
// Chat instance is initialised (state connected, getMe answered).

import http from "node:http";

import { createMemoryState } from "@chat-adapter/state-memory";
import { createRedisState } from "@chat-adapter/state-redis";
import { createTelegramAdapter } from "@chat-adapter/telegram";
import { Chat, ConsoleLogger } from "chat";

const env = process.env;
const port = Number(env.PEER_PORT ?? 8787);
const logLevel = env.PEER_LOG_LEVEL ?? "warn";

function stateAdapter() {
  if ((env.PEER_STATE ?? "memory") === "redis") {
    return createRedisState({ url: env.REDIS_URL });
  }
  return createMemoryState();
}

const telegram = createTelegramAdapter({
  mode: "webhook",
  botToken: env.TELEGRAM_BOT_TOKEN,
  secretToken: env.TELEGRAM_WEBHOOK_SECRET_TOKEN,
  apiUrl: env.TELEGRAM_API_BASE_URL,
  logger: new ConsoleLogger(logLevel),
});

const bot = new Chat({
  userName: "peer_bench_bot",
  adapters: { telegram },
  state: stateAdapter(),
  concurrency: env.PEER_DEBOUNCE_MS
    ? { strategy: "burst", debounceMs: Number(env.PEER_DEBOUNCE_MS) }
    : "burst",
  logger: logLevel,
});

bot.onDirectMessage(async (thread, message, _channel, context) => {
  const burst = [...(context?.skipped ?? []), message];
  await thread.post(burst.map((m) => m.text).join("\n"));
});

// A web Request from node's IncomingMessage, the shape bot.webhooks.* takes.
async function toRequest(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const headers = new Headers();
  for (const [name, value] of Object.entries(req.headers)) {
    if (value !== undefined) headers.set(name, Array.isArray(value) ? value.join(", ") : value);
  }
  return new Request(`http://127.0.0.1:${port}${req.url}`, {
    method: req.method,
    headers,
    body: chunks.length ? Buffer.concat(chunks) : undefined,
  });
}

async function send(res, response) {
  const body = Buffer.from(await response.arrayBuffer());
  res.writeHead(response.status, { ...Object.fromEntries(response.headers), "content-length": body.length });
  res.end(body);
}

// Handler runs keep going after the 200 (the SDK fires them and returns); a long-running
// server has nothing to extend, so waitUntil only keeps their errors visible.
const waitUntil = (task) => {
  task.catch((error) => console.error("handler failed", error));
};

const server = http.createServer(async (req, res) => {
  try {
    if (req.method === "POST" && req.url === "/webhooks/telegram") {
      await send(res, await bot.webhooks.telegram(await toRequest(req), { waitUntil }));
    } else if (req.method === "GET" && req.url === "/healthz") {
      res.writeHead(200, { "content-type": "text/plain" }).end("ok");
    } else {
      res.writeHead(404).end();
    }
  } catch (error) {
    console.error("request failed", error);
    if (!res.headersSent) res.writeHead(500);
    res.end();
  }
});
server.keepAliveTimeout = 60_000;

await bot.initialize();
server.listen(port, "127.0.0.1", () => console.log(`peer listening on 127.0.0.1:${port}`));

for (const signal of ["SIGTERM", "SIGINT"]) {
  process.on(signal, () => {
    server.close();
    bot.shutdown?.().finally(() => process.exit(0));
    setTimeout(() => process.exit(0), 2000).unref();
  });
}
