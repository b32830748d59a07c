"use strict";
// The live dashboard: a snapshot on connect and after every burst of events; the
// countdowns tick in the browser between them. Every text it writes is in the reader's
// language (gettext from /console/jsi18n/; the words of the server's payloads, such as
// states and reasons, through the tables below).
(() => {
  const C = window.AgentloopConsole;
  const {el, fmt} = C;
  const root = document.getElementById("dashboard");
  const status = document.getElementById("connection");
  const FEED_LENGTH = 30;
  const REASONS = {window: gettext("window closed"), max_wait: gettext("max wait reached"),
                   max_messages: gettext("max messages reached"), media: gettext("media / non-text"),
                   album: gettext("an album kept the window open"), control: gettext("control command"),
                   edit: gettext("an edit re-runs a cancelled turn"), person: gettext("a person answered")};
  const {WINDOW_KINDS, TURN_STATES, word} = C;
  const LEDGER_STATES = {pending: gettext("pending"), attempting: gettext("sending"), delivered: gettext("delivered"),
                         failed: gettext("failed"), unreachable: gettext("unreachable"), abandoned: gettext("abandoned")};
  const OUTCOMES = {delivered: gettext("delivered"), flood: gettext("flood control"), temporary: gettext("temporary failure"),
                    permanent: gettext("permanent failure"), ambiguous: gettext("ambiguous"), not_sent: gettext("not sent"),
                    unauthorized: gettext("credentials refused")};
  const PROPOSAL_STATES = {applied: gettext("applied"), rejected: gettext("rejected"), failed: gettext("failed"),
                           expired: gettext("expired"), applying: gettext("applying"), pending: gettext("awaiting approval"),
                           unknown: gettext("unknown")};
  const FLAGS = {high: gettext("high"), "never fires": gettext("never fires")};
  const DISPOSITIONS = {control: gettext("control command"), rejected: gettext("rejected: a turn was running"),
                        dropped: gettext("dropped"), overflow: gettext("not buffered: too many pending"),
                        context: gettext("group context, not answered"), limited: gettext("over a limit, not answered"),
                        bot: gettext("from a bot, not answered")};
  let picture = null;
  // A conversation's whole story (the page under /console/conversations/<id>/story/).
  const STORY = JSON.parse(document.getElementById("admin-links").textContent).story;
  const story = (id) => id == null ? null
    : el("a", {href: STORY.replace("/0/", `/${encodeURIComponent(id)}/`), class: "story-link",
               title: gettext("the whole story")}, gettext("story"));

  const socket = C.connect(root.dataset.socket, {
    status: (text, kind) => C.setStatus(status, text, kind),
    message(data) {
      if (data.type === "snapshot") render(data);
      else if (data.type === "event") feed(data.event);
      else if (data.type === "decided") note(fmt(gettext("Proposal %(id)s: %(state)s"), {id: data.proposal, state: word(PROPOSAL_STATES, data.state)}));
      else if (data.type === "held") { note(held(data)); rechip(data); }
      else if (data.type === "error") note(C.errorText(data));
    },
  });

  function held(data) {
    const text = data.action === "take_over" ? gettext("Conversation %(id)s: you hold it now; reply from its story")
      : gettext("Conversation %(id)s: the agent answers again");
    return fmt(text, {id: data.conversation}) + (data.changed ? "" : ` ${gettext("(already)")}`);
  }

  function section(id, rows) {
    const node = document.getElementById(id);
    const card = node.closest(".card");
    const count = card.querySelector(".count");
    if (count) count.textContent = String(rows.length);
    const empty = card.querySelector(".empty");
    if (empty) empty.hidden = rows.length > 0;
    return node.tagName === "TABLE" ? node.tBodies[0] : node;
  }

  function render(data) {
    picture = data;
    C.syncClock(data.now);
    section("buffers", data.buffers).replaceChildren(...data.buffers.map((b) => el("tr", {"data-flush-at": b.flush_at, "data-window": b.window_seconds},
      el("td", {}, C.link("conversation", b.conversation, `${b.contact} @ ${b.channel}`), " ", story(b.conversation)),
      el("td", {}, C.number(b.messages)),
      el("td", {}, C.duration(b.window_seconds), b.window_kind ? el("span", {class: "muted"}, ` ${word(WINDOW_KINDS, b.window_kind)}`) : null),
      el("td", {class: "countdown"}, el("span", {class: "seconds"}), el("span", {class: "bar"}, el("span", {class: "bar-fill"}))))));
    section("turns", data.turns).replaceChildren(...data.turns.map((t) => el("tr", {},
      el("td", {}, C.link("turn", t.turn, `#${t.turn}`), " ", el("span", {class: "muted"}, t.channel), " ", story(t.conversation)),
      el("td", {}, t.agent),
      el("td", {}, el("span", {class: `pill pill-${t.state === "running" ? "ok" : "wait"}`}, word(TURN_STATES, t.state)),
        t.fired_effect ? el("span", {class: "pill pill-effect", title: gettext("an effect fired: never cancelled")}, gettext("effect")) : null),
      el("td", {"data-since": t.started_at || t.created_at}, C.since(t.started_at || t.created_at)))));
    section("proposals", data.proposals).replaceChildren(...data.proposals.map((p) => el("li", {},
      el("div", {}, C.link("proposal", p.proposal, `${p.tool}`), " ",
        el("span", {class: "muted", "data-expires": p.expires_at, "data-conversation": p.conversation ?? "—"}, expiry(p))),
      args(p.arguments),
      data.can_decide ? el("div", {class: "actions"},
        el("button", {type: "button", class: "button default", onclick: () => decide("apply", p.proposal)}, gettext("Apply")),
        el("button", {type: "button", class: "button", onclick: () => decide("reject", p.proposal)}, gettext("Reject"))) : null)));
    section("ledger", data.ledger).replaceChildren(...data.ledger.map((s) => el("li", {class: `stat stat-${s.state}${s.count ? "" : " stat-zero"}`},
      el("a", {href: C.adminList("ledger", `state__exact=${s.state}`)}, el("strong", {}, C.number(s.count) + (s.more ? "+" : "")), " ", word(LEDGER_STATES, s.state)))));
    section("backlog", data.backlog).replaceChildren(...data.backlog.map((b) => el("tr", {},
      el("td", {}, b.channel),
      el("td", {}, C.number(b.queued)), el("td", {}, C.number(b.sending)),
      el("td", {}, b.retrying ? el("span", {class: "pill pill-wait"}, C.number(b.retrying)) : C.number(0)),
      el("td", {}, b.per_second ? fmt(gettext("%(rate)s/s"), {rate: C.number(b.per_second)}) : gettext("unpaced"),
        b.paused_seconds > 1 ? el("span", {class: "pill pill-wait", title: gettext("the platform asked us to wait (429)")},
          ` ${fmt(gettext("paused %(duration)s"), {duration: C.duration(b.paused_seconds)})}`) : null),
      el("td", {}, b.drain_seconds === null ? "—" : C.duration(b.drain_seconds)))));
    // Conversations the loop breaker holds until an operator gives them back (docs/people-in-control.md).
    section("paused", data.paused).replaceChildren(...data.paused.map((p) => el("li", {},
      C.link("conversation", p.conversation, `${p.contact} @ ${p.channel}`), " ", story(p.conversation), " ",
      el("span", {class: "muted"}, fmt(gettext("paused %(when)s"), {when: C.ago(p.held_at)})))));
    // The tool in the reader's words; the stored summary (English, as the guard wrote it) on hover.
    section("duplicates", data.duplicates).replaceChildren(...data.duplicates.map((d) => el("li", {title: d.summary},
      C.link("duplicate", d.id, d.tool ? fmt(gettext("%(tool)s not done again"), {tool: d.tool}) : d.summary || gettext("duplicate")), " ",
      el("span", {class: "muted"}, C.ago(d.at)))));
    if (!document.getElementById("feed").children.length) data.events.slice().reverse().forEach(feed);
    perDay(data.charts.duplicates_per_day);
    C.hbars(document.getElementById("chart-per-tool"), data.charts.duplicates_per_tool);
    C.hbars(document.getElementById("chart-reasons"), data.charts.flush_reasons, REASONS);
    C.hbars(document.getElementById("chart-outcomes"), data.charts.delivery_outcomes);
    span("span-reasons", data.charts.since, "flush_reasons", "turns");
    span("span-outcomes", data.charts.since, "delivery_outcomes", "replies");
    section("telemetry", data.telemetry).replaceChildren(...data.telemetry.map((t) => el("tr", {class: t.flag ? "flagged" : ""},
      el("td", {}, el("code", {}, t.tool)), el("td", {}, C.number(t.claims)), el("td", {}, C.number(t.duplicates)),
      el("td", {}, C.number(t.per_100_turns)),
      el("td", {}, t.flag ? el("span", {class: `pill pill-${t.flag === "high" ? "bad" : "wait"}`}, word(FLAGS, t.flag)) : "—"))));
    tick();
  }

  function expiry(p) {
    const left = Math.max(0, C.secondsUntil(p.expires_at));
    const conversation = p.conversation ?? "—";
    return fmt(gettext("conversation %(id)s · expires in %(duration)s"),
      {id: conversation, duration: C.duration(left, {display: "long"})});
  }

  // A proposal's arguments as the fields an operator reads, not raw JSON.
  function args(values) {
    if (!values || typeof values !== "object" || Array.isArray(values)) return el("code", {class: "args"}, JSON.stringify(values));
    return el("dl", {class: "args"}, ...Object.entries(values).flatMap(([key, value]) => [
      el("dt", {}, key), el("dd", {}, C.longText(typeof value === "string" ? value : JSON.stringify(value)))]));
  }

  // A 24-hour chart shrunk to the latest rows of a busy day says from when it counts.
  function span(id, since, chart, rows) {
    const shrunk = since && since[chart] !== since.day;
    const text = rows === "turns" ? gettext("(latest %(count)s turns: since %(time)s)") : gettext("(latest %(count)s replies: since %(time)s)");
    document.getElementById(id).textContent = shrunk
      ? fmt(text, {count: C.number(since.latest), time: C.clock(since[chart])}) : gettext("(24 h)");
  }

  function perDay(days) {
    const entries = Object.entries(days || {});
    const max = Math.max(1, ...entries.map(([, n]) => n));
    const chart = document.getElementById("chart-per-day");
    chart.replaceChildren(...entries.map(([day, n]) => el("div", {class: "vbar", title: `${day}: ${C.number(n)}`},
      el("span", {class: "vbar-value"}, n ? C.number(n) : ""),
      el("span", {class: "vbar-fill", style: `height:${(100 * n / max).toFixed(1)}%`}),
      el("span", {class: "vbar-label"}, day.slice(8)))));
  }

  function feed(event) {
    const list = document.getElementById("feed");
    list.prepend(el("li", {class: `feed-${event.kind}${event.event === "duplicate_prevented" ? " feed-duplicate" : ""}`},
      el("time", {}, C.clock(event.at) || C.clock(new Date(C.serverNow()).toISOString())), " ", describe(event)));
    while (list.children.length > FEED_LENGTH) list.lastChild.remove();
  }

  // A message in the feed, with the control to take its conversation over (or give it back).
  function describe(e) {
    if (e.kind === "message") {
      const held = e.disposition === "held";
      const wait = e.disposition === "buffered" ? fmt(gettext("buffered, window %(window)s"), {window: C.duration(e.window_seconds)})
        : held ? (e.held_by ? fmt(gettext("held by %(person)s: reply from its story"), {person: e.held_by})
          : gettext("held: a person holds this chat, reply from its story"))
          : word(DISPOSITIONS, e.disposition);
      return [C.link("conversation", e.conversation, `${e.contact} @ ${e.channel}`), ": ",
        el("q", {class: "feed-text", title: e.text}, e.text), ` (${wait}) `, story(e.conversation), " ",
        holdButton(held ? "give_back" : "take_over", e.conversation)];
    }
    if (e.kind === "turn") {
      const state = word(TURN_STATES, e.state);
      const what = e.reply !== undefined ? state : `${state} (${word(REASONS, e.reason)})`;
      return [C.link("turn", e.turn, fmt(gettext("turn #%(id)s"), {id: e.turn})), ` ${what}`,
        e.reply ? [": ", el("q", {class: "feed-text", title: e.reply}, e.reply.slice(0, 80))] : null, " ", story(e.conversation)];
    }
    if (e.kind === "audit") return audit(e);
    if (e.kind === "delivery") {
      return fmt(gettext("sends recorded: %(delivered)s delivered, %(failed)s failed"),
        {delivered: C.number(e.delivered), failed: C.number(e.failed)});
    }
    return e.kind === "note" ? "" : e.kind;  // a note's text is appended by note()
  }

  // A person's move names the person (the actor's display name: olga, not console:olga).
  const PEOPLE = {conversation_taken_over: gettext("%(person)s took the conversation over"),
                  conversation_given_back: gettext("%(person)s gave the conversation back to the agent"),
                  person_replied: gettext("%(person)s replied")};
  function audit(e) {
    const target = e.event === "duplicate_prevented" ? "duplicate" : "event";
    if (PEOPLE[e.event] && e.actor) {
      return [C.link(target, e.id, fmt(PEOPLE[e.event], {person: e.actor})),
        e.summary ? [": ", el("q", {class: "feed-text", title: e.summary}, e.summary)] : null, " ", story(e.conversation)];
    }
    const label = (picture && picture.labels && picture.labels.event[e.event]) || e.label;
    // An event about a tool names the tool; its stored summary (in the words it was recorded in) on hover.
    if (e.tool) return [C.link(target, e.id, label), ": ", el("code", {title: e.summary}, e.tool), " ", story(e.conversation)];
    return [C.link(target, e.id, label), e.summary ? `: ${e.summary}` : ""];
  }

  function holdButton(action, conversation) {
    const give = action === "give_back";
    return el("button", {type: "button", class: `chip-button${give ? " chip-button-held" : ""}`,
      "data-conversation": conversation, onclick: () => holdChat(action, conversation)},
      give ? gettext("Give back") : gettext("Take over"));
  }

  // Taken over (or given back): every chip of that conversation in the feed offers the other move.
  function rechip(data) {
    const next = data.action === "take_over" ? "give_back" : "take_over";
    for (const chip of document.querySelectorAll(`#feed .chip-button[data-conversation="${CSS.escape(String(data.conversation))}"]`)) {
      chip.replaceWith(holdButton(next, data.conversation));
    }
  }

  function note(text) {
    feed({kind: "note", at: new Date(C.serverNow()).toISOString()});
    document.getElementById("feed").firstChild.append(text);
  }

  function holdChat(action, conversation) {
    if (!socket.send({action, conversation: Number(conversation)})) note(gettext("Not connected; try again in a moment."));
  }

  function decide(action, proposal) {
    if (action === "reject" && !window.confirm(fmt(gettext("Reject proposal %(id)s?"), {id: proposal}))) return;
    if (!socket.send({action, proposal})) note(gettext("Not connected; try again in a moment."));
  }

  function tick() {
    for (const row of document.querySelectorAll("#buffers tbody tr")) {
      const left = Math.max(0, C.secondsUntil(row.dataset.flushAt));
      const window_ = Math.max(0.001, Number(row.dataset.window) || left);
      row.querySelector(".seconds").textContent = C.duration(left, {digits: 1});
      row.querySelector(".bar-fill").style.width = `${Math.min(100, (100 * left) / window_).toFixed(1)}%`;
    }
    for (const cell of document.querySelectorAll("[data-since]")) cell.textContent = C.since(cell.dataset.since);
    for (const span_ of document.querySelectorAll("#proposals [data-expires]")) {
      span_.textContent = expiry({expires_at: span_.dataset.expires, conversation: span_.dataset.conversation});
    }
  }
  setInterval(tick, 100);
})();
