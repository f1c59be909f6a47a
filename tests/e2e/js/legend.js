// The legend toggle of one result plot (hooks/results.py legend_toggle): the marks of the
// plot's data area before and after a click on its first legend entry. Called twice: with
// {index, step: "before"} it returns the opacities and the first entry's label; with
// step "after" the same, read after the click.
({ index }) => {
  const svg = document.querySelectorAll(".result-plot")[index].querySelector("svg");
  const marks = [...svg.querySelectorAll(".role-mark > path, .role-mark > line, .role-mark > rect")];
  const label = svg.querySelector(".role-legend-label text");
  return {
    label: label ? label.textContent : null,
    entries: svg.querySelectorAll(".role-legend-symbol path").length,
    marks: marks.map((m) => ({
      opacity: Number(getComputedStyle(m).opacity),
      aria: m.getAttribute("aria-label") || "",
    })),
  };
}
