// The served HTML of the current page, before any script ran: its mermaid sources and plots.
async () => {
  const response = await fetch(location.href.split("#")[0], {cache: "no-store"});
  const doc = new DOMParser().parseFromString(await response.text(), "text/html");
  return {
    // Material's fence output is <pre class="mermaid">; other integrations use <div class="mermaid">.
    mermaid: [...doc.querySelectorAll("pre.mermaid, div.mermaid")].map((el) => el.textContent.trim()),
    plots: doc.querySelectorAll(".result-plot").length,
  };
}
