"use strict";
// The playground: a web chat with one webchat channel, showing what happens between the
// messages — the debounce countdown, the merge into a turn, typing, the reply, and any
// duplicate the guard caught — as it happens.
(() => {
  const C = window.AgentloopConsole;
  const {el} = C;
  const root = document.getElementById("playground");
  const log = document.getElementById("chat-log");
  const form = document.getElementById("chat-form");
  const input = document.getElementById("chat-input");
  const countdown = document.getElementById("countdown");
  const typing = document.getElementById("typing");
  const TYPING_LASTS = 6000; // ms: a typing signal is refreshed every few seconds while a turn runs
  let deadline = null; // {flushAt, window}
  let typingUntil = 0;
  let conversation = null;

  const socket = C.connect(root.dataset.socket, {
    status: (text, kind) => C.setStatus(document.getElementById("connection"), text, kind),
    message: handle,
  });

  function handle(data) {
    if (data.type === "hello") {
      conversation = data.conversation;
      document.getElementById("conversation-link").replaceChildren("· ", C.link("conversation", conversation, `conversation ${conversation}`));
      log.replaceChildren(...data.transcript.map((item) => item.kind === "reply" ? bubble("agent", item.text, item.at) : bubble("me", item.text, item.at)));
      scroll();
    } else if (data.type === "admitted") {
      admitted(data);
    } else if (data.type === "error") {
      system(data.error, "error");
    } else if (data.type === "event") {
      event(data.event);
    }
  }

  function admitted(a) {
    C.syncClock(a.now);
    if (a.duplicate) { system("That message was already received (same id): ignored.", "muted"); return; }
    if (a.disposition === "buffered" && a.flush_at) {
      deadline = {flushAt: a.flush_at, window: a.window_seconds};
      countdown.querySelector(".label").textContent =
        `Waiting ${a.window_seconds} s for more messages (${a.window_kind || "window"})…`;
      countdown.hidden = false;
    } else if (a.disposition === "rejected") {
      system("A turn is running: this message was rejected (the channel's double-texting strategy).", "muted");
    }
  }

  function event(e) {
    if (e.kind === "turn" && e.reply === undefined) {
      deadline = null;
      countdown.hidden = true;
      const lines = (e.text || "").split("\n").filter(Boolean).length;
      system(["Merged ", `${lines} message${lines === 1 ? "" : "s"}`, " into ", C.link("turn", e.turn, `turn #${e.turn}`),
              e.state === "ready" ? " (queued)" : ""], "merge");
    } else if (e.kind === "typing") {
      typingUntil = Date.now() + TYPING_LASTS;
      typing.hidden = false;
    } else if (e.kind === "turn") {
      typingUntil = 0;
      typing.hidden = true;
      if (e.state !== "done") system([C.link("turn", e.turn, `Turn #${e.turn}`), ` ${e.state}${e.outcome ? `: ${e.outcome}` : ""}`], "error");
    } else if (e.kind === "reply") {
      typingUntil = 0;
      typing.hidden = true;
      log.append(bubble("agent", e.text));
    } else if (e.kind === "audit" && e.event === "duplicate_prevented") {
      system([C.link("duplicate", e.id, "Duplicate prevented by the guard"), `: ${e.summary}`], "duplicate");
    } else if (e.kind === "audit") {
      system([C.link("event", e.id, e.label), e.summary ? `: ${e.summary}` : ""], "muted");
    }
    scroll();
  }

  function bubble(who, text, at) {
    return el("li", {class: `bubble bubble-${who}`},
      el("span", {class: "visually-hidden"}, who === "me" ? "You: " : "Agent: "),
      el("span", {class: "text"}, text),
      el("time", {}, C.clock(at || new Date(C.serverNow()).toISOString())));
  }

  function system(content, kind) {
    log.append(el("li", {class: `system system-${kind}`}, content));
    scroll();
  }

  function scroll() {
    log.scrollTop = log.scrollHeight;
  }

  function send() {
    const text = input.value.trim();
    if (!text) return;
    const id = (crypto.randomUUID && crypto.randomUUID()) || `${Date.now()}-${Math.random()}`;
    if (!socket.send({text, id})) { system("Not connected yet; try again in a moment.", "error"); return; }
    log.append(bubble("me", text));
    input.value = "";
    scroll();
  }

  form.addEventListener("submit", (e) => { e.preventDefault(); send(); });
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });

  setInterval(() => {
    if (deadline) {
      const left = Math.max(0, C.secondsUntil(deadline.flushAt));
      countdown.querySelector(".seconds").textContent = `${left.toFixed(1)} s`;
      countdown.querySelector(".bar-fill").style.width = `${Math.min(100, (100 * left) / Math.max(0.001, deadline.window)).toFixed(1)}%`;
    }
    if (typingUntil && Date.now() > typingUntil) { typing.hidden = true; typingUntil = 0; }
  }, 100);
})();
