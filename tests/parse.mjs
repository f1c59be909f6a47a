// Parse every mermaid diagram and every formula of the pages on the CPU, with the site's own
// pinned mermaid and KaTeX (node_modules/), as the browser would. Reads
// [{where, kind: "mermaid" | "math", text, display}] as JSON on stdin; prints
// [{where, message}] for each that fails.
import katex from "katex";
import { JSDOM } from "jsdom";

// mermaid sanitizes labels with DOMPurify, which needs a window: give it jsdom's.
const { window } = new JSDOM("");
globalThis.window = window;
globalThis.document = window.document;
const { default: mermaid } = await import("mermaid");

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const items = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const problems = [];
for (const item of items) {
  try {
    if (item.kind === "mermaid") await mermaid.parse(item.text);
    else katex.renderToString(item.text, { displayMode: !!item.display, throwOnError: true });
  } catch (err) {
    const message = String(err && err.message ? err.message : err).split("\n").filter(Boolean);
    problems.push({ where: item.where, message: message.slice(0, 2).join(" ") });
  }
}
process.stdout.write(JSON.stringify(problems));
