// The story page (templates/console/story.html): filters by kind that hide the entries of
// the kinds switched off, without a reload, and expand/collapse all. Every entry is a
// <details>, collapsed on arrival; an anchor in the URL (#turn-12) opens its entry.
(function () {
  "use strict";
  const story = document.getElementById("story");
  if (!story) return;
  const entries = () => story.querySelectorAll(".story-entry");
  const hidden = new Set();

  function apply() {
    entries().forEach((li) => { li.hidden = hidden.has(li.dataset.group); });
  }

  story.querySelectorAll(".story-filter").forEach((button) => {
    button.addEventListener("click", () => {
      const group = button.dataset.filter;
      if (hidden.has(group)) hidden.delete(group); else hidden.add(group);
      button.setAttribute("aria-pressed", String(!hidden.has(group)));
      apply();
    });
  });

  story.querySelectorAll("[data-expand]").forEach((button) => {
    button.addEventListener("click", () => {
      const open = button.dataset.expand === "open";
      entries().forEach((li) => { if (!li.hidden) li.querySelector("details").open = open; });
    });
  });

  function openTarget() {
    const target = location.hash && document.getElementById(location.hash.slice(1));
    const details = target && target.classList.contains("story-entry") && target.querySelector("details");
    if (details) details.open = true;
  }
  window.addEventListener("hashchange", openTarget);
  openTarget();
})();
