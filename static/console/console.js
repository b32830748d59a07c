"use strict";
// Shared by the console's pages: admin links, a tiny element builder, the reader's
// language (texts from Django's JavaScriptCatalog at /console/jsi18n/, loaded before this
// file: gettext, ngettext, interpolate; times and durations through Intl in the page's
// language), and a websocket that reconnects by itself.
window.AgentloopConsole = (() => {
  const links = JSON.parse(document.getElementById("admin-links").textContent);
  const LANG = document.documentElement.lang || "en";
  let clockOffset = 0; // server time minus browser time, in ms

  // "%(name)s" placeholders filled from an object (Django's interpolate, named).
  function fmt(text, values) {
    return window.interpolate(text, values, true);
  }

  // `text` with its placeholders filled by nodes or strings: for a translated sentence
  // with a link inside ("Merged 2 messages into %(turn)s").
  function fill(text, values) {
    return text.split(/%\((\w+)\)s/).map((part, index) => index % 2 ? values[part] : part);
  }

  // The words of the server's payloads an operator reads, in the reader's language.
  const WINDOW_KINDS = {closed: gettext("closed"), greeting: gettext("greeting"), open: gettext("open"),
                        neutral: gettext("neutral"), media: gettext("media"), album: gettext("album")};
  const TURN_STATES = {ready: gettext("queued"), running: gettext("running"), done: gettext("done"),
                       cancelled: gettext("cancelled"), failed: gettext("failed")};
  const word = (table, key) => (table && table[key]) || key;
  // The websockets' errors by their code (agentloop/console/consumers.py); one without a
  // known code is shown as the server wrote it.
  const ERRORS = {cannot_decide: gettext("Your role cannot decide proposals."),
                  cannot_hold: gettext("Your role cannot take conversations over."),
                  withdrawn: gettext("Your access to this page was withdrawn."),
                  empty: gettext("A message needs some text."),
                  too_long: gettext("Messages are limited to %(limit)s characters."),
                  refused: gettext("Message refused: %(detail)s"),
                  edit_refused: gettext("Edit refused: %(detail)s")};
  function errorText(data) {
    return data.code && ERRORS[data.code] ? fmt(ERRORS[data.code], data) : data.error;
  }

  // Intl formatters are costly to build and a page asks for few kinds: kept by their options.
  const formatters = new Map();
  function formatter(kind, options) {
    const key = `${kind}:${JSON.stringify(options)}`;
    if (!formatters.has(key)) formatters.set(key, new Intl[kind](LANG, options));
    return formatters.get(key);
  }

  // A span in the largest unit it reaches once rounded, largest first: 86,390 s is
  // 1,440 min, so 24 h, so 1 day ("1 día", "1 dia"); under a minute, in seconds.
  function rounded(seconds) {
    const span = Math.abs(seconds);
    if (Math.round(span) < 60) return ["second", span];
    const minutes = Math.round(span / 60);
    if (minutes < 60) return ["minute", minutes];
    const hours = Math.round(span / 3600);
    if (hours < 24) return ["hour", hours];
    return ["day", Math.round(span / 86400)];
  }

  // `display`: "long" ("3 minutes") or "short" ("3 min"); seconds with `digits` decimals.
  function duration(seconds, {display = "short", digits = 0} = {}) {
    const [unit, value] = rounded(seconds);
    const decimals = unit === "second" ? digits : 0;
    return formatter("NumberFormat", {style: "unit", unit, unitDisplay: display,
      minimumFractionDigits: decimals, maximumFractionDigits: decimals}).format(value);
  }

  // "3 minutes ago" / "hace 3 minutos" / "há 3 minutos".
  function ago(iso) {
    if (!iso) return "";
    const [unit, value] = rounded(Math.max(0, (serverNow() - Date.parse(iso)) / 1000));
    return formatter("RelativeTimeFormat", {numeric: "auto"}).format(-Math.round(value), unit);
  }

  function number(n) {
    return formatter("NumberFormat", {}).format(n);
  }

  function adminUrl(kind, id) {
    return `${links[kind]}${encodeURIComponent(id)}/change/`;
  }

  function adminList(kind, query) {
    return query ? `${links[kind]}?${query}` : links[kind];
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // A text past `limit` characters: its start, and the whole text one click away.
  function longText(text, limit = 160) {
    if (text.length <= limit) return text;
    return el("details", {class: "long-text"}, el("summary", {title: gettext("Show all")}, `${text.slice(0, limit)}…`),
      el("div", {}, text));
  }

  function link(kind, id, label) {
    return el("a", {href: adminUrl(kind, id)}, label);
  }

  function syncClock(serverIso) {
    if (serverIso) clockOffset = Date.parse(serverIso) - Date.now();
  }

  function serverNow() {
    return Date.now() + clockOffset;
  }

  function secondsUntil(iso) {
    return (Date.parse(iso) - serverNow()) / 1000;
  }

  // How long since `iso`, as a short duration ("12 sec", "3 min").
  function since(iso) {
    if (!iso) return "";
    const s = Math.max(0, (serverNow() - Date.parse(iso)) / 1000);
    return s < 60 ? duration(s, {digits: s < 10 ? 1 : 0}) : duration(Math.floor(s / 60) * 60);
  }

  function clock(iso) {
    return iso ? formatter("DateTimeFormat", {timeStyle: "medium"}).format(new Date(iso)) : "";
  }

  // A websocket to `path` that reconnects with backoff; `status(text, kind)` is told.
  function connect(path, {message, status}) {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    let socket = null;
    let delay = 500;
    function open() {
      socket = new WebSocket(`${scheme}://${location.host}${path}`);
      socket.addEventListener("open", () => { delay = 500; status(gettext("live"), "ok"); });
      socket.addEventListener("message", (e) => message(JSON.parse(e.data)));
      socket.addEventListener("close", () => {
        status(gettext("disconnected — reconnecting…"), "bad");
        setTimeout(open, delay);
        delay = Math.min(delay * 2, 10000);
      });
    }
    open();
    return {
      send(data) {
        if (!socket || socket.readyState !== WebSocket.OPEN) return false;
        socket.send(JSON.stringify(data));
        return true;
      },
    };
  }

  function setStatus(node, text, kind) {
    node.textContent = text;
    node.className = `pill pill-${kind}`;
  }

  // Horizontal bars for a {label: count} object.
  function hbars(container, counts, labels) {
    const entries = Object.entries(counts || {}).sort((a, b) => b[1] - a[1]);
    const max = Math.max(1, ...entries.map(([, n]) => n));
    container.replaceChildren(...(entries.length ? entries.map(([key, n]) => el("div", {class: "hbar"},
      el("span", {class: "hbar-label"}, (labels && labels[key]) || key),
      el("span", {class: "hbar-track"}, el("span", {class: "hbar-fill", style: `width:${(100 * n / max).toFixed(1)}%`})),
      el("span", {class: "hbar-value"}, number(n)))) : [el("p", {class: "muted"}, gettext("Nothing yet."))]));
  }

  return {adminUrl, adminList, el, link, syncClock, serverNow, secondsUntil, since, ago, duration, number, clock, fmt,
    fill, word, errorText, longText, WINDOW_KINDS, TURN_STATES, connect, setStatus, hbars};
})();
