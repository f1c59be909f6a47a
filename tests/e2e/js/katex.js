// check_katex: every .arithmatex element is typeset by KaTeX; no error, no raw delimiters.
() => {
  const problems = [];
  const raw = /\\\(|\\\)|\\\[|\\\]|\$\$/;
  const outside = (root, skip) => {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {
      acceptNode: (n) => n.parentElement.closest(skip) ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT,
    });
    let text = "";
    while (walker.nextNode()) text += walker.currentNode.nodeValue;
    return text;
  };
  // With throwOnError: false, KaTeX shows an undefined command as red text, not as an error.
  const unknown = (el) => [...el.querySelectorAll(".katex-html .mord.text[style*='color']")]
    .filter((t) => /^(rgb\(204, 0, 0\)|#cc0000)$/i.test(t.style.color) && t.textContent.startsWith("\\"))
    .map((t) => t.textContent);
  document.querySelectorAll(".arithmatex").forEach((el, i) => {
    const tex = (el.querySelector("annotation[encoding='application/x-tex']") || el).textContent.trim();
    const name = `formula ${i + 1} «${tex.replace(/\s+/g, " ").slice(0, 60)}»`;
    const error = el.querySelector(".katex-error");
    if (error) {
      problems.push(`${name}: KaTeX error: ${error.getAttribute("title") || error.textContent}`);
    } else if (!el.querySelector(".katex")) {
      problems.push(`${name}: not typeset by KaTeX (left as raw TeX; unbalanced braces?)`);
    } else if (unknown(el).length) {
      problems.push(`${name}: KaTeX error: unknown command(s) ${unknown(el).join(", ")} (shown in red)`);
    } else if (raw.test(outside(el, ".katex"))) {
      problems.push(`${name}: raw TeX delimiters left: ${JSON.stringify(outside(el, ".katex").trim().slice(0, 60))}`);
    }
  });
  const article = document.querySelector("article") || document.body;
  const prose = outside(article, "code, pre, script, style, .katex, .arithmatex, .mermaid");
  const m = prose.match(/.{0,30}(\$\$|\\\(|\\\[).{0,30}/s);
  if (m) problems.push(`raw TeX outside any formula: ${JSON.stringify(m[0].trim())}`);
  return problems;
}
