// check a calculator's form: type each test vector's inputs into it (as a reader would, then
// one input event) and compare every shown output with the Python one, exactly (numbers as IEEE
// doubles, text outputs character for character); then choose
// every preset and check that it fills the form with its values. One entry per problem.
({ name, stored }) => {
  const form = document.querySelector(`form[data-calculator="${name}"]`);
  if (!form) return [`no <form data-calculator="${name}"> on the page`];
  if (!form.dataset.ready) return [`${name}: docs/assets/calculator.js did not start the form`];
  const problems = [];
  const fire = (el, type) => el.dispatchEvent(new Event(type, { bubbles: true }));
  stored.vectors.forEach((vector, i) => {
    for (const [key, value] of Object.entries(vector.input)) {
      const el = form.elements.namedItem(key);
      if (!el) { problems.push(`vector ${i}: the form has no input ${key}`); continue; }
      el.value = String(value);
      if (el.value !== String(value)) problems.push(`vector ${i}: input ${key} refuses ${value}`);
    }
    fire(form.elements[0], "input");
    for (const [key, want] of Object.entries(vector.output)) {
      const out = form.querySelector(`output[name="${key}"]`);
      if (!out) { problems.push(`vector ${i}: the form shows no output ${key}`); continue; }
      const got = typeof want === "string" ? out.dataset.value : Number(out.dataset.value);
      if (got !== want || out.value === "—") {
        problems.push(`vector ${i}: ${key} shows ${out.value} (${out.dataset.value}), ` +
                      `Python ${want}; inputs ${JSON.stringify(vector.input)}`);
      }
    }
  });
  for (const select of form.querySelectorAll("select[data-preset]")) {
    for (const choice of stored.presets[select.dataset.preset] || []) {
      select.value = choice.id;
      fire(select, "change");
      for (const [key, value] of Object.entries(choice.values)) {
        const el = form.elements.namedItem(key);
        if (!el || Number(el.value) !== value) {
          problems.push(`preset ${choice.id}: ${key} is ${el && el.value}, not ${value}`);
        }
      }
      const blank = [...form.querySelectorAll("output")].filter((o) => o.value === "—");
      if (blank.length) problems.push(`preset ${choice.id}: ${blank.length} outputs show —`);
    }
  }
  const first = form.querySelector("input[type=number], textarea");
  first.value = "";
  fire(first, "input");
  if ([...form.querySelectorAll("output")].some((o) => o.value !== "—")) {
    problems.push(`an empty ${first.name} still shows numbers, not —`);
  }
  return problems;
}
