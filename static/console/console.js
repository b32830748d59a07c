"use strict";
// Shared by the console's pages: admin links, a tiny element builder, time helpers and
// a websocket that reconnects by itself.
window.AgentloopConsole = (() => {
  const links = JSON.parse(document.getElementById("admin-links").textContent);
  let clockOffset = 0; // server time minus browser time, in ms

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
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
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

  function since(iso) {
    if (!iso) return "";
    const s = Math.max(0, (serverNow() - Date.parse(iso)) / 1000);
    if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min`;
    if (s < 86400) return `${Math.floor(s / 3600)} h`;
    return `${Math.floor(s / 86400)} d`;
  }

  function clock(iso) {
    return iso ? new Date(iso).toLocaleTimeString() : "";
  }

  // A websocket to `path` that reconnects with backoff; `status(text, kind)` is told.
  function connect(path, {message, status}) {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    let socket = null;
    let delay = 500;
    function open() {
      socket = new WebSocket(`${scheme}://${location.host}${path}`);
      socket.addEventListener("open", () => { delay = 500; status("live", "ok"); });
      socket.addEventListener("message", (e) => message(JSON.parse(e.data)));
      socket.addEventListener("close", () => {
        status("disconnected — reconnecting…", "bad");
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
      el("span", {class: "hbar-value"}, String(n)))) : [el("p", {class: "muted"}, "Nothing yet.")]));
  }

  return {adminUrl, adminList, el, link, syncClock, serverNow, secondsUntil, since, clock, connect, setStatus, hbars};
})();
