// The channel form (conversations/admin_channels.py). The add page renders every platform's
// section, each marked "platform-<kind>": only the chosen kind's is shown. The server reads
// the chosen kind's fields only, so hiding the others is a view, never a rule. A collapsed
// section holding an error is opened, so the reason beside its field is seen.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  const kind = document.getElementById("id_kind");
  const show = () => {
    for (const section of document.querySelectorAll("fieldset.platform-section")) {
      section.style.display = section.classList.contains(`platform-${kind.value}`) ? "" : "none";
    }
  };
  if (kind) {
    kind.addEventListener("change", show);
    show();
  }
  for (const details of document.querySelectorAll("fieldset details")) {
    if (details.querySelector(".errorlist")) details.open = true;
  }
});
