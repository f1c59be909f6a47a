// Load the vendored mermaid, Vega and KaTeX (assets/vendor/) and the site's calculator.js and
// calculator.css only on pages that use them, and draw the result plots and formulas. Works with instant navigation: this
// file runs once, document$ on each page.
(() => {
  const assets = new URL("./", document.currentScript.src);
  const loading = {};

  // Add scripts (paths under assets/) to the page once each; several run in the order given.
  function loadScripts(names) {
    return Promise.all(names.map((name) => (loading[name] ??= new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = new URL(name, assets).href;
      script.async = names.length === 1;
      script.onload = resolve;
      script.onerror = () => reject(new Error("could not load " + script.src));
      document.head.appendChild(script);
    }))));
  }

  // Add a stylesheet (a path under assets/) to the page once; it stays for later pages.
  function loadStyle(name) {
    return (loading[name] ??= new Promise((resolve, reject) => {
      const link = document.createElement("link");
      link.rel = "stylesheet";
      link.href = new URL(name, assets).href;
      link.onload = resolve;
      link.onerror = () => reject(new Error("could not load " + link.href));
      document.head.appendChild(link);
    }));
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
      mermaidReady ??= loadScripts(["vendor/mermaid/mermaid.min.js"]).then(() => {
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
  const VEGA = [
    "vendor/vega/vega.min.js", "vendor/vega/vega-lite.min.js", "vendor/vega/vega-embed.min.js",
  ];

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
          // tooltips: four significant digits, no exponent (4096, 48.46, 0.00196)
          config: { background: null, font: "inherit", tooltipFormat: { numberFormat: ",.4~r" } },
        }))
        .then(() => { box.dataset.rendered = "1"; delete box.dataset.error; }, failed(box, target));
    }
  }

  // Formulas: pymdownx.arithmatex output, typeset by the vendored KaTeX once it is loaded.
  // Only .arithmatex elements are touched, so a "$" in prose stays text. When every formula
  // of the page is typeset, body[data-math] says so (the browser suite waits for it).
  const KATEX = ["vendor/katex/katex.min.js", "vendor/katex/contrib/auto-render.min.js"];

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

  // Calculators (hooks/calculators.py renders each ```calculator fence into a form), styled by
  // calculator.css: calculator.js starts them; once loaded it subscribes to document$, which replays the current page to it,
  // and starts the forms of every later page itself. A failed load is kept in the forms'
  // data-error, where the browser suite looks.
  function startCalculators(root) {
    const forms = root.querySelectorAll("form[data-calculator]");
    if (forms.length === 0) return;
    Promise.all([loadStyle("calculator.css"), loadScripts(["calculator.js"])]).catch((err) => {
      for (const form of forms) form.dataset.error = String(err.message);
      console.error(err);
    });
  }

  document$.subscribe(({ body }) => {
    typeset(body);
    drawPlots(body);
    startCalculators(body);
  });
  new MutationObserver(() => drawPlots(document.body)).observe(document.body, {
    attributes: true,
    attributeFilter: ["data-md-color-scheme"],
  });
})();
