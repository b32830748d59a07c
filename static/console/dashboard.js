"use strict";
// The live dashboard: a snapshot on connect and after every burst of events; the
// countdowns tick in the browser between them.
(() => {
  const C = window.AgentloopConsole;
  const {el} = C;
  const root = document.getElementById("dashboard");
  const status = document.getElementById("connection");
  const FEED_LENGTH = 30;
  const REASONS = {window: "window closed", max_wait: "max wait reached", max_messages: "max messages reached",
                   media: "media / non-text", control: "control command",
                   edit: "an edit re-runs a cancelled turn"};
  let picture = null;
  // A conversation's whole story (the page under /console/conversations/<id>/story/).
  const STORY = JSON.parse(document.getElementById("admin-links").textContent).story;
  const story = (id) => id == null ? null
    : el("a", {href: STORY.replace("/0/", `/${encodeURIComponent(id)}/`), class: "story-link", title: "the whole story"}, "story");

  const socket = C.connect(root.dataset.socket, {
    status: (text, kind) => C.setStatus(status, text, kind),
    message(data) {
      if (data.type === "snapshot") render(data);
      else if (data.type === "event") feed(data.event);
      else if (data.type === "decided") note(`Proposal ${data.proposal}: ${data.state}`);
      else if (data.type === "held") note(`Conversation ${data.conversation}: ${data.action === "take_over" ? "a person holds it" : "the agent answers"}${data.changed ? "" : " (already)"}`);
      else if (data.type === "error") note(data.error);
    },
  });

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
      el("td", {}, String(b.messages)),
      el("td", {}, `${b.window_seconds} s`, b.window_kind ? el("span", {class: "muted"}, ` ${b.window_kind}`) : null),
      el("td", {class: "countdown"}, el("span", {class: "seconds"}), el("span", {class: "bar"}, el("span", {class: "bar-fill"}))))));
    section("turns", data.turns).replaceChildren(...data.turns.map((t) => el("tr", {},
      el("td", {}, C.link("turn", t.turn, `#${t.turn}`), " ", el("span", {class: "muted"}, t.channel), " ", story(t.conversation)),
      el("td", {}, t.agent),
      el("td", {}, el("span", {class: `pill pill-${t.state === "running" ? "ok" : "wait"}`}, t.state),
        t.fired_effect ? el("span", {class: "pill pill-effect", title: "an effect fired: never cancelled"}, "effect") : null),
      el("td", {"data-since": t.started_at || t.created_at}, C.since(t.started_at || t.created_at)))));
    section("proposals", data.proposals).replaceChildren(...data.proposals.map((p) => el("li", {},
      el("div", {}, C.link("proposal", p.proposal, `${p.tool}`), " ",
        el("span", {class: "muted"}, `conversation ${p.conversation ?? "—"} · expires in ${Math.max(0, C.secondsUntil(p.expires_at) / 60).toFixed(0)} min`)),
      el("code", {class: "args"}, JSON.stringify(p.arguments)),
      data.can_decide ? el("div", {class: "actions"},
        el("button", {type: "button", class: "button default", onclick: () => decide("apply", p.proposal)}, "Apply"),
        el("button", {type: "button", class: "button", onclick: () => decide("reject", p.proposal)}, "Reject")) : null)));
    section("ledger", data.ledger).replaceChildren(...data.ledger.map((s) => el("li", {class: `stat stat-${s.state}`},
      el("a", {href: C.adminList("ledger", `state__exact=${s.state}`)}, el("strong", {}, String(s.count) + (s.more ? "+" : "")), " ", s.state))));
    section("backlog", data.backlog).replaceChildren(...data.backlog.map((b) => el("tr", {},
      el("td", {}, b.channel),
      el("td", {}, String(b.queued)), el("td", {}, String(b.sending)),
      el("td", {}, b.retrying ? el("span", {class: "pill pill-wait"}, String(b.retrying)) : "0"),
      el("td", {}, b.per_second ? `${b.per_second}/s` : "unpaced",
        b.paused_seconds > 1 ? el("span", {class: "pill pill-wait", title: "the platform asked us to wait (429)"}, ` paused ${b.paused_seconds} s`) : null),
      el("td", {}, b.drain_seconds === null ? "—" : `${b.drain_seconds} s`))));
    // Conversations the loop breaker holds until an operator gives them back (docs/people-in-control.md).
    section("paused", data.paused).replaceChildren(...data.paused.map((p) => el("li", {},
      C.link("conversation", p.conversation, `${p.contact} @ ${p.channel}`), " ", story(p.conversation), " ",
      el("span", {class: "muted"}, `paused ${C.since(p.held_at)} ago`))));
    section("duplicates", data.duplicates).replaceChildren(...data.duplicates.map((d) => el("li", {},
      C.link("duplicate", d.id, d.summary || d.tool || "duplicate"), " ",
      el("span", {class: "muted"}, `${C.since(d.at)} ago`))));
    if (!document.getElementById("feed").children.length) data.events.slice().reverse().forEach(feed);
    perDay(data.charts.duplicates_per_day);
    C.hbars(document.getElementById("chart-per-tool"), data.charts.duplicates_per_tool);
    C.hbars(document.getElementById("chart-reasons"), data.charts.flush_reasons, REASONS);
    C.hbars(document.getElementById("chart-outcomes"), data.charts.delivery_outcomes);
    span("span-reasons", data.charts.since, "flush_reasons", "turns");
    span("span-outcomes", data.charts.since, "delivery_outcomes", "replies");
    section("telemetry", data.telemetry).replaceChildren(...data.telemetry.map((t) => el("tr", {class: t.flag ? "flagged" : ""},
      el("td", {}, el("code", {}, t.tool)), el("td", {}, String(t.claims)), el("td", {}, String(t.duplicates)),
      el("td", {}, String(t.per_100_turns)),
      el("td", {}, t.flag ? el("span", {class: `pill pill-${t.flag === "high" ? "bad" : "wait"}`}, t.flag) : "—"))));
    tick();
  }

  // A 24-hour chart shrunk to the latest rows of a busy day says from when it counts.
  function span(id, since, chart, rows) {
    const shrunk = since && since[chart] !== since.day;
    document.getElementById(id).textContent = shrunk ? `(latest ${since.latest.toLocaleString()} ${rows}: since ${C.clock(since[chart])})` : "(24 h)";
  }

  function perDay(days) {
    const entries = Object.entries(days || {});
    const max = Math.max(1, ...entries.map(([, n]) => n));
    const chart = document.getElementById("chart-per-day");
    chart.replaceChildren(...entries.map(([day, n]) => el("div", {class: "vbar", title: `${day}: ${n}`},
      el("span", {class: "vbar-value"}, n ? String(n) : ""),
      el("span", {class: "vbar-fill", style: `height:${(100 * n / max).toFixed(1)}%`}),
      el("span", {class: "vbar-label"}, day.slice(8)))));
  }

  function feed(event) {
    const list = document.getElementById("feed");
    list.prepend(el("li", {class: `feed-${event.kind}${event.event === "duplicate_prevented" ? " feed-duplicate" : ""}`},
      el("time", {}, C.clock(event.at) || C.clock(new Date(C.serverNow()).toISOString())), " ", describe(event)));
    while (list.children.length > FEED_LENGTH) list.lastChild.remove();
  }

  function describe(e) {
    if (e.kind === "message") {
      const wait = e.disposition === "buffered" ? `buffered, window ${e.window_seconds} s`
        : e.disposition === "held" ? "held: a person holds this chat, reply from its story" : e.disposition;
      const hold = e.disposition === "held" ? "give_back" : "take_over";
      return [C.link("conversation", e.conversation, `${e.contact} @ ${e.channel}`), `: “${e.text}” (${wait}) `, story(e.conversation),
        " ", el("button", {type: "button", class: "button", onclick: () => holdChat(hold, e.conversation)},
          hold === "give_back" ? "give back" : "take over")];
    }
    if (e.kind === "turn") {
      const what = e.reply !== undefined ? `${e.state}${e.reply ? `: “${e.reply.slice(0, 80)}”` : ""}` : `${e.state} (${REASONS[e.reason] || e.reason})`;
      return [C.link("turn", e.turn, `turn #${e.turn}`), ` ${what} `, story(e.conversation)];
    }
    if (e.kind === "audit") {
      return [C.link(e.event === "duplicate_prevented" ? "duplicate" : "event", e.id, e.label), e.summary ? `: ${e.summary}` : ""];
    }
    if (e.kind === "delivery") return `sends recorded: ${e.delivered} delivered, ${e.failed} failed`;
    return e.kind;
  }

  function note(text) {
    feed({kind: "note", at: new Date(C.serverNow()).toISOString()});
    document.getElementById("feed").firstChild.append(text);
  }

  function holdChat(action, conversation) {
    if (!socket.send({action, conversation: Number(conversation)})) note("not connected; try again in a moment");
  }

  function decide(action, proposal) {
    if (action === "reject" && !window.confirm(`Reject proposal ${proposal}?`)) return;
    if (!socket.send({action, proposal})) note("not connected; try again in a moment");
  }

  function tick() {
    for (const row of document.querySelectorAll("#buffers tbody tr")) {
      const left = Math.max(0, C.secondsUntil(row.dataset.flushAt));
      const window_ = Math.max(0.001, Number(row.dataset.window) || left);
      row.querySelector(".seconds").textContent = `${left.toFixed(1)} s`;
      row.querySelector(".bar-fill").style.width = `${Math.min(100, (100 * left) / window_).toFixed(1)}%`;
    }
    for (const cell of document.querySelectorAll("[data-since]")) cell.textContent = C.since(cell.dataset.since);
  }
  setInterval(tick, 100);
})();
