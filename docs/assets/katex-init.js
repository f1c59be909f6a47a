// Typeset pymdownx.arithmatex output with the local KaTeX, on first load and after
// instant navigation. Only .arithmatex elements are touched, so a "$" in prose stays text.
document$.subscribe(({ body }) => {
  for (const el of body.querySelectorAll(".arithmatex")) {
    renderMathInElement(el, {
      delimiters: [
        { left: "\\(", right: "\\)", display: false },
        { left: "\\[", right: "\\]", display: true },
      ],
      throwOnError: false,
    });
  }
});
