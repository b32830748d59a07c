"use strict";
// The playground: a web chat with one webchat channel, showing what happens between the
// messages — the debounce countdown, the merge into a turn, typing, the reply, and any
// duplicate the guard caught — as it happens. The person's own messages can be edited
// (the edit counts: conversations/edits.py decides what it changes). A file is attached
// over HTTP (agentloop/console/uploads.py), with what is typed as its caption; an image
// shows as a thumbnail by its signed /files/ link.
(() => {
  const C = window.AgentloopConsole;
  const {el, fmt} = C;
  const NOT_CONNECTED = gettext("Not connected yet; try again in a moment.");
  const root = document.getElementById("playground");
  const log = document.getElementById("chat-log");
  const form = document.getElementById("chat-form");
  const input = document.getElementById("chat-input");
  const countdown = document.getElementById("countdown");
  const typing = document.getElementById("typing");
  const TYPING_LASTS = 6000; // ms: a typing signal is refreshed every few seconds while a turn runs
  let deadline = null; // {flushAt, window}
  let typingUntil = 0;
  let preview = null; // the bubble of a reply being streamed
  let conversation = null;
  let editing = null; // {id, item}: the message the input is correcting
  const sendButton = form.querySelector("button[type=submit]");
  const fileInput = document.getElementById("chat-file");
  // Unfold's script fills a text field beside every file input in its forms; this one has
  // none (it would throw on each file picked): marked as already handled.
  fileInput.hasChangeListener = true;
  const csrfToken = form.querySelector("[name=csrfmiddlewaretoken]").value;

  const socket = C.connect(root.dataset.socket, {
    status: (text, kind) => C.setStatus(document.getElementById("connection"), text, kind),
    message: handle,
  });

  function handle(data) {
    if (data.type === "hello") {
      conversation = data.conversation;
      document.getElementById("conversation-link").replaceChildren("· ", C.link("conversation", conversation, fmt(gettext("conversation %(id)s"), {id: conversation})));
      const mine = (item) => (item.id || "").startsWith("console:") ? item.id.slice(8) : null;
      // The socket opens before its hello arrives: a message sent in between is not in
      // this transcript yet, and its bubble (with its edit link) must not vanish.
      const known = new Set(data.transcript.map(mine).filter(Boolean));
      const sentMeanwhile = [...log.querySelectorAll(".bubble-me[data-message]")]
        .filter((item) => !known.has(item.dataset.message));
      log.replaceChildren(...data.transcript.flatMap((item) => item.kind === "reply"
        ? (item.buttons ? [question(item.text, item.buttons)] : agentBubbles(item.text, item.files, item.at, item.by))
        : [bubble("me", item.text, item.at, mine(item), {edited: item.edited, file: item.file})]), ...sentMeanwhile);
      scroll();
    } else if (data.type === "admitted") {
      admitted(data);
    } else if (data.type === "edited") {
      edited(data);
    } else if (data.type === "confirmation") {
      if (data.outcome) decided(data.data.split(":")[1], data.outcome);
      else system(data.text, "muted"); // e.g. "This button is no longer valid."
    } else if (data.type === "error") {
      system(C.errorText(data), "error");
    } else if (data.type === "event") {
      event(data.event);
    }
  }

  function admitted(a) {
    C.syncClock(a.now);
    if (a.duplicate) { system(gettext("That message was already received (same id): ignored."), "muted"); return; }
    if (a.disposition === "buffered" && a.flush_at) {
      deadline = {flushAt: a.flush_at, window: a.window_seconds};
      countdown.querySelector(".label").textContent = fmt(gettext("Waiting %(duration)s for more messages (%(window)s)…"),
        {duration: C.duration(a.window_seconds), window: C.word(C.WINDOW_KINDS, a.window_kind || "") || gettext("window")});
      countdown.hidden = false;
    } else if (a.disposition === "rejected") {
      system(gettext("A turn is running: this message was rejected (the channel's double-texting strategy)."), "muted");
    }
  }

  function event(e) {
    if (e.kind === "turn" && e.reply === undefined) {
      deadline = null;
      countdown.hidden = true;
      const lines = (e.text || "").split("\n").filter(Boolean).length;
      const merged = ngettext("Merged %(count)s message into %(turn)s", "Merged %(count)s messages into %(turn)s", lines);
      system([...C.fill(merged, {count: C.number(lines), turn: C.link("turn", e.turn, turnName(e.turn))}),
              e.state === "ready" ? ` ${gettext("(queued)")}` : ""], "merge");
    } else if (e.kind === "typing") {
      typingUntil = Date.now() + TYPING_LASTS;
      typing.hidden = false;
    } else if (e.kind === "turn") {
      typingUntil = 0;
      typing.hidden = true;
      if (e.state !== "done") {
        system([C.link("turn", e.turn, turnName(e.turn)), ` ${C.word(C.TURN_STATES, e.state)}${e.outcome ? `: ${e.outcome}` : ""}`], "error");
      }
    } else if (e.kind === "preview") {
      // A streamed reply as it is written (docs/streaming.md): one bubble, replaced by the final.
      typingUntil = 0;
      typing.hidden = true;
      if (!preview) { preview = bubble("agent", ""); preview.classList.add("bubble-preview"); log.append(preview); }
      preview.querySelector(".text").textContent = e.text;
    } else if (e.kind === "preview_end") {
      if (preview) { preview.remove(); preview = null; }
    } else if (e.kind === "reply") {
      typingUntil = 0;
      typing.hidden = true;
      if (preview) { preview.remove(); preview = null; }
      if (e.buttons) log.append(question(e.text, e.buttons));
      else log.append(...agentBubbles(e.text, e.files, undefined, e.by));
    } else if (e.kind === "question_decided") {
      decided(e.token, e.text); // on every page watching: a tap on another device shows here too
    } else if (e.kind === "audit" && e.event === "duplicate_prevented") {
      system([C.link("duplicate", e.id, gettext("Duplicate prevented by the guard")), ": ",
              e.tool ? el("code", {title: e.summary}, e.tool) : e.summary], "duplicate");
    } else if (e.kind === "audit") {
      system([C.link("event", e.id, e.label), e.summary ? `: ${e.summary}` : ""], "muted");
    }
    scroll();
  }

  function turnName(id) {
    return fmt(gettext("turn #%(id)s"), {id});
  }

  // `by`: a person's reply (conversations.handoff) is labelled with who wrote it, not "Agent".
  function bubble(who, text, at, id, {edited: wasEdited = false, file = null, by = ""} = {}) {
    const item = el("li", {class: `bubble bubble-${who}${by ? " bubble-person" : ""}`},
      by ? el("span", {class: "bubble-by"}, by) : el("span", {class: "visually-hidden"}, who === "me" ? gettext("You: ") : gettext("Agent: ")),
      attachment(file),
      el("span", {class: "text"}, text),
      el("time", {}, C.clock(at || new Date(C.serverNow()).toISOString())));
    if (who === "me" && id) {
      item.dataset.message = id;
      if (wasEdited) markEdited(item);
      item.append(el("button", {type: "button", class: "bubble-edit", title: gettext("Edit this message"),
        onclick: () => startEditing(id, item)}, gettext("edit")));
    }
    return item;
  }

  // A reply: its text, then each file it carries in a bubble of its own (a file chunk
  // of the ledger row arrives as its own reply event, its caption as the text).
  function agentBubbles(text, files, at, by = "") {
    if (!files || !files.length) return [bubble("agent", text, at, null, {by})];
    return files.map((f, index) => bubble("agent", index === 0 ? text : "", at, null, {by,
      file: {kind: (f.type || "").startsWith("image/") ? "photo" : "document", name: f.name, url: f.url}}));
  }

  // A file in a bubble: an image as a thumbnail (its signed link answers 404 until the
  // worker has read the upload back: tried again for a few seconds), anything else by name.
  function attachment(file) {
    if (!file) return null;
    if (file.kind !== "photo") return el("span", {class: "bubble-file"}, `📎 ${file.name || file.kind}`);
    let tries = 0;
    const img = el("img", {class: "bubble-thumb loading", src: file.url, alt: file.name || gettext("the image you sent"),
      onload: () => img.classList.remove("loading"),
      onerror: () => { if (++tries <= 20) setTimeout(() => { img.src = `${file.url}?try=${tries}`; }, 500); }});
    return el("a", {href: file.url, target: "_blank", rel: "noopener", class: "bubble-thumb-link"}, img);
  }

  // Attach: the file goes over HTTP with what is typed as its caption; the answer is the
  // same `admitted` the socket gives a message, and the file's signed link.
  async function attach(file) {
    const caption = editing ? "" : input.value.trim();
    const id = (crypto.randomUUID && crypto.randomUUID()) || `${Date.now()}-${Math.random()}`;
    const body = new FormData();
    body.append("file", file);
    body.append("text", caption);
    body.append("id", id);
    let response, answer;
    try {
      response = await fetch(form.dataset.upload, {method: "POST", body, credentials: "same-origin",
        headers: {"X-CSRFToken": csrfToken}});
      answer = await response.json();
    } catch (err) {
      system(fmt(gettext("The file could not be sent: %(error)s"), {error: String(err)}), "error");
      return;
    }
    if (response.status !== 202) {
      system(fmt(gettext("The file was not sent: %(error)s"), {error: answer.error || response.status}), "error");
      return;
    }
    if (caption) input.value = "";
    if (!answer.duplicate) log.append(bubble("me", caption, null, id, {file: answer.file}));
    admitted(answer);
    scroll();
  }

  function markEdited(item) {
    if (!item.querySelector(".edited")) item.querySelector("time").prepend(el("span", {class: "edited"}, `${gettext("edited")} · `));
  }

  // Editing: the input takes the message's text; Send becomes "Save edit"; Escape cancels.
  function startEditing(id, item) {
    editing = {id, item};
    input.value = item.querySelector(".text").textContent;
    sendButton.textContent = gettext("Save edit");
    item.classList.add("bubble-editing");
    input.focus();
  }

  function stopEditing() {
    if (editing) editing.item.classList.remove("bubble-editing");
    editing = null;
    sendButton.textContent = gettext("Send");
  }

  const EDIT_OUTCOMES = {
    buffered: gettext("Edit applied: the waiting message was corrected and its window re-armed."),
    rerun: gettext("Edit applied: the running turn was cancelled and runs again with the corrected text."),
    noted: gettext("Edit noted: the agent reads it in its next turn."),
    unchanged: gettext("Same text as before: nothing changed."),
    not_applied: gettext("Edit not applied"),
    ignored: gettext("This channel ignores edits: nothing changed."),
    unknown_message: gettext("That message is not known here."),
  };

  function edited(e) {
    const item = log.querySelector(`[data-message="${CSS.escape(e.id)}"]`);
    const changed = ["buffered", "rerun", "noted"].includes(e.outcome);
    if (item && changed) {
      item.querySelector(".text").textContent = e.text;
      markEdited(item);
    }
    if (e.outcome === "buffered" && e.flush_at) {
      C.syncClock(e.now);
      deadline = {flushAt: e.flush_at, window: e.window_seconds};
      countdown.querySelector(".label").textContent = fmt(gettext("Edited: waiting %(duration)s again (%(window)s)…"),
        {duration: C.duration(e.window_seconds), window: C.word(C.WINDOW_KINDS, e.window_kind)});
      countdown.hidden = false;
    }
    const what = e.duplicate ? gettext("That edit was already applied.") : EDIT_OUTCOMES[e.outcome] || e.outcome;
    system(e.outcome === "not_applied" ? `${what}: ${e.detail}` : what, changed ? "merge" : "muted");
  }

  // A question asking to confirm an action: its buttons send the tap over the socket; the
  // server applies it once and answers with the outcome, which replaces the buttons.
  function question(text, buttons) {
    const item = bubble("agent", text);
    const token = buttons[0].data.split(":")[1];
    item.dataset.question = token;
    item.append(el("div", {class: "actions question-buttons"}, ...buttons.map((b) =>
      el("button", {type: "button", class: "button", "data-choice": b.data.endsWith(":y") ? "yes" : "no",
        onclick: () => { if (!socket.send({confirm: b.data})) system(NOT_CONNECTED, "error"); }},
      b.label))));
    return item;
  }

  function decided(token, text) {
    const item = log.querySelector(`[data-question="${CSS.escape(token)}"]`);
    if (!item) { system(text, "muted"); return; }
    item.querySelector(".text").textContent = text;
    const buttons = item.querySelector(".question-buttons");
    if (buttons) buttons.remove();
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
    if (editing) {
      if (!socket.send({edit: editing.id, text})) { system(NOT_CONNECTED, "error"); return; }
      stopEditing();
      input.value = "";
      return;
    }
    const id = (crypto.randomUUID && crypto.randomUUID()) || `${Date.now()}-${Math.random()}`;
    if (!socket.send({text, id})) { system(NOT_CONNECTED, "error"); return; }
    log.append(bubble("me", text, null, id));
    input.value = "";
    scroll();
  }

  form.addEventListener("submit", (e) => { e.preventDefault(); send(); });
  fileInput.addEventListener("change", () => {
    const [file] = fileInput.files;
    fileInput.value = "";
    if (file) attach(file);
  });
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
    if (e.key === "Escape" && editing) { stopEditing(); input.value = ""; }
  });

  setInterval(() => {
    if (deadline) {
      const left = Math.max(0, C.secondsUntil(deadline.flushAt));
      countdown.querySelector(".seconds").textContent = C.duration(left, {digits: 1});
      countdown.querySelector(".bar-fill").style.width = `${Math.min(100, (100 * left) / Math.max(0.001, deadline.window)).toFixed(1)}%`;
    }
    if (typingUntil && Date.now() > typingUntil) { typing.hidden = true; typingUntil = 0; }
  }, 100);
})();
