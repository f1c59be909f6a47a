// Load the vendored mermaid, Vega and KaTeX (assets/vendor/) only on pages that use them, and
// draw the result plots and formulas. Works with instant navigation: this file runs once, document$ on each page.
(() => {
  const vendor = new URL("vendor/", document.currentScript.src);
  const loading = {};

  // Add scripts to the page once each; several run in the order given.
  function loadScripts(names) {
    return Promise.all(names.map((name) => (loading[name] ??= new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = new URL(name, vendor).href;
      script.async = names.length === 1;
      script.onload = resolve;
      script.onerror = () => reject(new Error("could not load " + script.src));
      document.head.appendChild(script);
    }))));
  }

  // Material renders pre.mermaid itself, and fetches mermaid from unpkg.com when window.mermaid
  // is undefined at its first diagram. This stand-in is defined before Material mounts (scripts
  // run before DOMContentLoaded); it takes Material's config and loads the real mermaid, which
  // replaces it, at the first render. Material calls only initialize() and render().
  let mermaidConfig;
  let mermaidReady;
  const mermaidStandIn = {
    initialize(config) { mermaidConfig = config; },
    async render(...args) {
      mermaidReady ??= loadScripts(["mermaid/mermaid.min.js"]).then(() => {
        if (window.mermaid === mermaidStandIn) throw new Error("mermaid.min.js set no mermaid");
        window.mermaid.initialize(mermaidConfig);
        return window.mermaid;
      });
      return (await mermaidReady).render(...args);
    },
  };
  window.mermaid = mermaidStandIn;

  // Result plots: a Vega-Lite spec the build put in data-spec, drawn with vega-embed.
  // A failure is shown in place and kept in data-error, where the browser suite looks.
  const VEGA = ["vega/vega.min.js", "vega/vega-lite.min.js", "vega/vega-embed.min.js"];

  function drawPlots(root) {
    const boxes = root.querySelectorAll(".result-plot");
    if (boxes.length === 0) return;
    const failed = (box, target) => (err) => {
      box.dataset.error = String(err && err.message ? err.message : err);
      target.textContent = "图表渲染失败：" + box.dataset.error;
    };
    const dark = document.body.getAttribute("data-md-color-scheme") === "slate";
    const vega = loadScripts(VEGA);
    for (const box of boxes) {
      let target = box.querySelector(".result-plot-view");
      if (!target) {
        target = document.createElement("div");
        target.className = "result-plot-view";
        box.appendChild(target);
      }
      box.dataset.rendered = "";
      vega
        .then(() => vegaEmbed(target, JSON.parse(box.dataset.spec), {
          mode: "vega-lite",
          renderer: "svg",
          actions: false,
          theme: dark ? "dark" : undefined,
          config: { background: null, font: "inherit" },
        }))
        .then(() => { box.dataset.rendered = "1"; delete box.dataset.error; }, failed(box, target));
    }
  }

  // Formulas: pymdownx.arithmatex output, typeset by the vendored KaTeX once it is loaded.
  // Only .arithmatex elements are touched, so a "$" in prose stays text. When every formula
  // of the page is typeset, body[data-math] says so (the browser suite waits for it).
  const KATEX = ["katex/katex.min.js", "katex/contrib/auto-render.min.js"];

  function typeset(root) {
    const formulas = root.querySelectorAll(".arithmatex");
    if (formulas.length === 0) return;
    delete document.body.dataset.math;
    loadScripts(KATEX).then(() => {
      for (const el of formulas) {
        renderMathInElement(el, {
          delimiters: [
            { left: "\\(", right: "\\)", display: false },
            { left: "\\[", right: "\\]", display: true },
          ],
          throwOnError: false,
        });
      }
      document.body.dataset.math = "typeset";
    }, (err) => console.error(err));
  }

  document$.subscribe(({ body }) => {
    typeset(body);
    drawPlots(body);
  });
  new MutationObserver(() => drawPlots(document.body)).observe(document.body, {
    attributes: true,
    attributeFilter: ["data-md-color-scheme"],
  });
})();
