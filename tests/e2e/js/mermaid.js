// check_mermaid: every diagram of the served HTML is an SVG (in Material's closed shadow root),
// with no mermaid error text, a visible size, and node text readable in the current palette.
(sources) => {
  const problems = [];
  const first = (text) => JSON.stringify(text.trim().split("\n")[0].slice(0, 60));
  const parse = (c) => {
    const m = c && c.match(/rgba?\(([^)]+)\)/);
    if (!m) return null;
    const v = m[1].split(/[ ,\/]+/).filter(Boolean).map(Number);
    return [v[0], v[1], v[2], v.length > 3 ? v[3] : 1];
  };
  const over = (top, bottom) => top.slice(0, 3).map((c, i) => c * top[3] + bottom[i] * (1 - top[3]));
  const lum = (rgb) => {
    const lin = rgb.map((c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2];
  };
  const contrast = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
  const pageBg = parse(getComputedStyle(document.body).backgroundColor) || [255, 255, 255, 1];
  const rendered = [...document.querySelectorAll("div.mermaid")];
  // Diagrams of the served HTML still shown as source: mermaid never rendered them.
  for (const pre of document.querySelectorAll("pre")) {
    const text = pre.textContent.trim();
    const i = sources.indexOf(text);
    if (i >= 0) problems.push(`diagram ${i + 1} ${first(text)} was not rendered (still its source in a <pre>)`);
  }
  if (rendered.length < sources.length && problems.length === 0)
    problems.push(`${sources.length} diagram(s) in the page, ${rendered.length} rendered`);
  rendered.forEach((div, k) => {
    const name = `diagram ${k + 1}`;
    const root = window.__e2eShadow.get(div) || div.shadowRoot || div;
    const svg = root.querySelector("svg");
    if (!svg) { problems.push(`${name}: no <svg> in div.mermaid`); return; }
    const copy = svg.cloneNode(true);
    copy.querySelectorAll("style").forEach((s) => s.remove());
    const text = copy.textContent.replace(/\s+/g, " ").trim();
    if (/syntax error|parse error|error in text|lexical error/i.test(text))
      problems.push(`${name}: mermaid error text in the SVG: ${JSON.stringify(text.slice(0, 120))}`);
    const box = div.getBoundingClientRect();
    if (box.width < 10 || box.height < 10)
      problems.push(`${name}: rendered SVG is ${Math.round(box.width)}x${Math.round(box.height)} px`);
    // Readability in this palette: node text against the node's own fill over the page.
    for (const node of svg.querySelectorAll("g.node")) {
      const shape = node.querySelector("rect, polygon, circle, ellipse, path");
      const label = node.querySelector(".nodeLabel, foreignObject span, foreignObject div, text");
      if (!shape || !label) continue;
      const fill = parse(getComputedStyle(shape).fill);
      const bg = fill ? over(fill, pageBg) : pageBg.slice(0, 3);
      const isText = label instanceof SVGElement;
      const fg = parse(isText ? getComputedStyle(label).fill : getComputedStyle(label).color);
      if (!fg) continue;
      const ratio = contrast(over(fg, bg), bg);
      if (ratio < 3) {
        problems.push(`${name}: node ${JSON.stringify(label.textContent.trim().slice(0, 30))} ` +
          `text is hard to read (contrast ${ratio.toFixed(2)}:1, text ${getComputedStyle(label).color}, ` +
          `node fill ${getComputedStyle(shape).fill}, page ${getComputedStyle(document.body).backgroundColor})`);
        break;
      }
    }
  });
  // Edges (arrows) against the page: a light theme's dark lines vanish on a dark page.
  rendered.forEach((div, k) => {
    const root = window.__e2eShadow.get(div) || div.shadowRoot || div;
    const edge = root.querySelector("path.flowchart-link, .edgePath path, line.messageLine0, .relation");
    const stroke = edge && parse(getComputedStyle(edge).stroke);
    if (!stroke) return;
    const ratio = contrast(over(stroke, pageBg), pageBg.slice(0, 3));
    if (ratio < 3)  // WCAG 1.4.11: 3:1 for graphical objects
      problems.push(`diagram ${k + 1}: edges are hard to see (contrast ${ratio.toFixed(2)}:1, ` +
        `stroke ${getComputedStyle(edge).stroke}, page ${getComputedStyle(document.body).backgroundColor})`);
  });
  // mermaid leaves its error diagram (a bomb, "Syntax error in text") at the end of the body.
  for (const el of document.querySelectorAll("body > div[id^='d'], body > svg[id]")) {
    const copy = el.cloneNode(true);
    copy.querySelectorAll("style").forEach((s) => s.remove());
    const text = copy.textContent.replace(/\s+/g, " ").trim();
    if (/syntax error|error in text/i.test(text))
      problems.push(`mermaid error diagram left at the end of the page: ${JSON.stringify(text.slice(0, 80))}`);
  }
  // mermaid's own message (which line, what it expected), from the rejected render.
  if (problems.length)
    for (const error of window.__e2eErrors || [])
      if (/parse error|lexical error|syntax error|mermaid/i.test(error))
        problems.push("mermaid says:\n" + error.slice(0, 600).split("\n").map((l) => "      " + l).join("\n"));
  return problems;
}
