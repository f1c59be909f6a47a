// check_plots: every result plot of the served HTML was drawn by vega-embed into an SVG with
// axes and data marks, at a visible size, with no error.
(expected) => {
  const problems = [];
  const boxes = [...document.querySelectorAll(".result-plot")];
  if (boxes.length < expected) problems.push(`${expected} plot(s) in the page, ${boxes.length} found`);
  boxes.forEach((box, k) => {
    const name = `plot ${k + 1} (${box.dataset.result})`;
    if (box.dataset.error) { problems.push(`${name}: vega-embed error: ${box.dataset.error}`); return; }
    const svg = box.querySelector("svg");
    if (!svg) { problems.push(`${name}: not drawn (no <svg>)`); return; }
    if (!svg.querySelector("g.role-axis")) problems.push(`${name}: no axes`);
    const marks = svg.querySelectorAll("g.role-mark path, g.role-mark line, g.role-mark rect");
    if (marks.length === 0) problems.push(`${name}: no data marks drawn`);
    const r = svg.getBoundingClientRect();
    if (r.width < 100 || r.height < 50) problems.push(`${name}: ${Math.round(r.width)}x${Math.round(r.height)} px`);
  });
  return problems;
}
