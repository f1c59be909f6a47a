// The legend toggle of one result plot (hooks/results.py legend_toggle): the marks of the
// plot's data area before and after a click on its first legend entry. Called twice: with
// {index, step: "before"} it returns the opacities and the first entry's label; with
// step "after" the same, read after the click. Also the legend labels Vega cut short ("…").
({ index }) => {
  const svg = document.querySelectorAll(".result-plot")[index].querySelector("svg");
  const marks = [...svg.querySelectorAll(".role-mark > path, .role-mark > line, .role-mark > rect")];
  const label = svg.querySelector(".role-legend-label text");
  return {
    label: label ? label.textContent : null,
    entries: svg.querySelectorAll(".role-legend-symbol path").length,
    truncated: [...svg.querySelectorAll(".role-legend-label text")]
      .map((t) => t.textContent)
      .filter((t) => t.endsWith("…")),
    marks: marks.map((m) => ({
      opacity: Number(getComputedStyle(m).opacity),
      aria: m.getAttribute("aria-label") || "",
    })),
  };
}
