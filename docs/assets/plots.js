// Draw each result plot (a Vega-Lite spec the build put in the page) with the vendored
// vega-embed, on first load, after instant navigation and when the palette changes.
// A failure is shown in place and kept in data-error, where the browser suite looks.
function drawPlots(root) {
  const dark = document.body.getAttribute("data-md-color-scheme") === "slate";
  for (const box of root.querySelectorAll(".result-plot")) {
    const spec = JSON.parse(box.dataset.spec);
    let target = box.querySelector(".result-plot-view");
    if (!target) {
      target = document.createElement("div");
      target.className = "result-plot-view";
      box.appendChild(target);
    }
    box.dataset.rendered = "";
    vegaEmbed(target, spec, {
      mode: "vega-lite",
      renderer: "svg",
      actions: false,
      theme: dark ? "dark" : undefined,
      config: { background: null, font: "inherit" },
    })
      .then(() => { box.dataset.rendered = "1"; delete box.dataset.error; })
      .catch((err) => {
        box.dataset.error = String(err && err.message ? err.message : err);
        target.textContent = "图表渲染失败：" + box.dataset.error;
      });
  }
}

document$.subscribe(({ body }) => drawPlots(body));
new MutationObserver(() => drawPlots(document.body)).observe(document.body, {
  attributes: true,
  attributeFilter: ["data-md-color-scheme"],
});
