// Hover tooltips of one result plot. With {index, step: "marks"}: scroll the plot into view and
// return the centres of up to 12 of its data marks (points, bars, line vertices' points, text);
// with step "tooltip": the keys of the tooltip vega-embed shows now (null when none shows).
({ index, step }) => {
  const box = document.querySelectorAll(".result-plot")[index];
  if (step === "tooltip") {
    const tip = document.getElementById("vg-tooltip-element");
    if (!tip || !tip.classList.contains("visible")) return null;
    return [...tip.querySelectorAll("td.key")].map((k) => k.textContent.replace(/:$/, ""));
  }
  box.scrollIntoView({ block: "center" });
  const marks = [...box.querySelectorAll("svg .role-mark > path, svg .role-mark > text")]
    .map((m) => m.getBoundingClientRect())
    .filter((r) => r.width > 0 && r.height > 0 && r.width < 200 && r.height < 200);
  const every = Math.max(1, Math.floor(marks.length / 12));
  return marks.filter((_, i) => i % every === 0).slice(0, 12)
    .map((r) => [r.x + r.width / 2, r.y + r.height / 2]);
}
