// check_copy_buttons: every code block has Material's copy button, aimed at that block.
() => {
  const problems = [];
  document.querySelectorAll(".md-content .highlight pre > code").forEach((code, i) => {
    if (code.closest(".no-copy")) return;  // opted out on purpose
    const pre = code.parentElement;
    const button = pre.querySelector(
      ":scope > nav.md-code__nav > button[data-md-type='copy'], :scope > .md-clipboard, :scope > nav .md-clipboard");
    const first = JSON.stringify(code.textContent.trim().split("\n")[0].slice(0, 50));
    if (!button) {
      problems.push(`code block ${i + 1} ${first} has no copy button`);
    } else {
      const target = button.getAttribute("data-clipboard-target");
      if (target && document.querySelector(target) !== code)
        problems.push(`code block ${i + 1} ${first}: copy button targets ${target}, not this block`);
    }
  });
  return problems;
}
