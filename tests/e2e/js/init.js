// Runs before any page script (page.add_init_script): keeps Material's closed mermaid shadow roots
// reachable (window.__e2eShadow) and records uncaught errors (window.__e2eErrors).
(() => {
  window.__e2eShadow = new WeakMap();
  window.__e2eErrors = [];
  const attach = Element.prototype.attachShadow;
  Element.prototype.attachShadow = function (init) {
    const root = attach.call(this, init);
    window.__e2eShadow.set(this, root);
    return root;
  };
  addEventListener("error", (e) => window.__e2eErrors.push(String(e.message)));
  addEventListener("unhandledrejection", (e) => window.__e2eErrors.push(String(e.reason)));
})();
