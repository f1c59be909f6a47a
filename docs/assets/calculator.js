// The calculators on the pages. hooks/calculators.py renders each ```calculator NAME fence into a
// <form data-calculator="NAME">; formulas[NAME] below computes its outputs from its inputs.
// Each formula repeats the Python function named above it term by term (same operations, same
// order, IEEE doubles), and both are checked on tests/fixtures/calculators/NAME.json: in Node
// (tests/test_calculators.py) and through the form on the built page (tests/e2e/test_calculators.py).
// No third-party code. assets/loader.js loads this file only on a page with a form; it then
// starts the forms of that page and of every later one, including Material's instant navigation.
(() => {
  "use strict";

  const whole = (name, n) => {
    if (!(n >= 1) || n !== Math.trunc(n)) throw new RangeError(`${name} must be a whole number >= 1`);
  };
  const sum = (xs) => xs.reduce((a, b) => a + b, 0);

  // ---- posts/metrics: snippets/metrics/calculators.py ----

  // mfu_calculator, with flops_per_token_6n, flops_per_token_palm and mfu (training.py)
  function mfu(x) {
    const n = x.params_b * 1e9;
    const six = 6 * n;
    const palm = 6 * n + 12 * x.layers * x.heads * x.head_dim * x.seq_len;
    const peak = x.peak_tflops * 1e12;
    const util = (flops) => (x.tgs * flops) / (1 * peak);
    return { flops_6n: six, flops_palm: palm, mfu_6n: util(six), mfu_palm: util(palm) };
  }

  // --8<-- [start:zero]
  // zero_calculator, with zero_model_states and zero_model_state_bytes (memory.py)
  function zero(x) {
    const out = {};
    for (const stage of [0, 1, 2, 3]) {
      const psi = x.params_b * 1e9;
      const nd = x.data_parallel;
      const states = {
        parameters: (2 * psi) / (stage >= 3 ? nd : 1),
        gradients: (2 * psi) / (stage >= 2 ? nd : 1),
        optimizer: (x.k * psi) / (stage >= 1 ? nd : 1),
      };
      const total = sum(Object.values(states));
      for (const [state, b] of Object.entries(states)) out[`stage${stage}_${state}`] = b;
      out[`stage${stage}_total`] = total;
      out[`stage${stage}_share`] = total / (x.memory_gb * 1e9);
    }
    return out;
  }
  // --8<-- [end:zero]

  // busbw_calculator, with bus_factor and busbw (roofline.py)
  function busbw(x) {
    const n = x.ranks;
    const factors = {
      all_reduce: (2 * (n - 1)) / n,
      reduce_scatter: (n - 1) / n,
      all_gather: (n - 1) / n,
      all_to_all: (n - 1) / n,
      broadcast: 1.0,
      reduce: 1.0,
    };
    if (!(x.op in factors)) throw new RangeError(`unknown collective ${x.op}`);
    const alg = (x.size_gb * 1e9) / (x.ms / 1e3);
    return { algbw: alg, busbw: alg * factors[x.op] };
  }

  // ---- posts/kv-cache: snippets/kv_cache/calculators.py, with formulas.py ----

  const BITS = { fp32: 32, bf16: 16, fp16: 16, fp8: 8, int8: 8, int4: 4 };

  function bytesPerElement(fmt, group, scaleBytes = 2) {
    const bits = BITS[fmt];
    if (bits === undefined) throw new RangeError(`unknown KV format ${fmt}`);
    return bits / 8 + (group ? scaleBytes / group : 0);
  }

  function elementsPerTokenLayer(cfg) {
    if ("kv_lora_rank" in cfg) return cfg.kv_lora_rank + cfg.qk_rope_head_dim;
    return 2 * cfg.num_key_value_heads * cfg.head_dim;
  }

  function layerWindows(cfg) {
    const { sliding_window: window, sliding_window_pattern: pattern } = cfg;
    const out = [];
    for (let i = 1; i <= cfg.num_hidden_layers; i++) {
      out.push(window === undefined || (pattern && i % pattern === 0) ? null : window);
    }
    return out;
  }

  const kvBytesPerToken = (cfg, fmt, group) =>
    cfg.num_hidden_layers * elementsPerTokenLayer(cfg) * bytesPerElement(fmt, group);

  function kvBytesPerSequence(cfg, tokens, fmt, group) {
    const kept = sum(layerWindows(cfg).map((w) => (w === null ? tokens : Math.min(tokens, w))));
    return kept * elementsPerTokenLayer(cfg) * bytesPerElement(fmt, group);
  }

  // form_config
  function formConfig(x) {
    if (!(x.kv_lora_rank || (x.kv_heads && x.head_dim))) throw new RangeError("no KV shape");
    const cfg = x.kv_lora_rank
      ? { kv_lora_rank: x.kv_lora_rank, qk_rope_head_dim: x.rope_dim }
      : { num_attention_heads: x.kv_heads, num_key_value_heads: x.kv_heads, head_dim: x.head_dim };
    cfg.num_hidden_layers = x.layers;
    if (x.window) cfg.sliding_window = x.window;
    if (x.window_pattern) cfg.sliding_window_pattern = x.window_pattern;
    return cfg;
  }

  // kv_calculator, with kv_budget, max_sequences, decode_bytes and decode_floor_s
  function kvCache(x) {
    whole("context", x.context);
    whole("batch", x.batch);
    whole("gpus", x.gpus);
    const cfg = formConfig(x);
    const group = x.group || null;
    const perSeq = kvBytesPerSequence(cfg, x.context, x.kv_format, group);
    let budget = x.gpus * x.memory_gb * 1e9 * x.utilization - x.params_b * 1e9 * x.weight_bytes
      - x.gpus * x.workspace_gb * 1e9;
    let fit = Math.floor(budget / perSeq);
    if (budget <= 0) [budget, fit] = [0, 0]; // the weights and the workspace leave no room
    const weightsRead = x.read_b * 1e9 * x.weight_bytes;
    const read = weightsRead + sum(Array(x.batch).fill(perSeq));
    const step = read / (x.gpus * x.bandwidth_tb_s * 1e12);
    return {
      per_token: kvBytesPerToken(cfg, x.kv_format, group),
      per_seq: perSeq,
      budget,
      max_seqs: fit,
      step_ms: step * 1e3,
      tokens_per_s: x.batch / step,
      kv_share: 1 - weightsRead / read,
    };
  }

  const formulas = { mfu, zero, busbw, "kv-cache": kvCache };
  window.handbookCalculator = Object.freeze({ formulas: Object.freeze(formulas) });

  // ---- the forms ----

  const fields = (form) =>
    form.querySelectorAll("input[name], textarea[name], select[name]:not([data-preset])");

  function read(form) {
    const x = {};
    for (const el of fields(form)) {
      x[el.name] = el.type === "number" ? (el.value.trim() === "" ? NaN : Number(el.value)) : el.value;
    }
    return x;
  }

  function shown(value, fmt) {
    if (fmt.text !== undefined) return typeof value === "string" ? value : "—";
    if (typeof value !== "number" || !Number.isFinite(value)) return "—";
    if (fmt.percent !== undefined) return `${(100 * value).toFixed(Number(fmt.digits ?? 1))} %`;
    const scaled = value * Number(fmt.scale ?? 1);
    const text = scaled.toFixed(Number(fmt.digits ?? 0));
    return fmt.unit ? `${text} ${fmt.unit}` : text;
  }

  function update(form) {
    let result = {};
    try {
      const x = read(form);
      if (Object.values(x).some((v) => Number.isNaN(v))) throw new RangeError("an input is empty");
      result = formulas[form.dataset.calculator](x);
      delete form.dataset.error;
    } catch (err) {
      form.dataset.error = String(err && err.message ? err.message : err);
    }
    for (const out of form.querySelectorAll("output[name]")) {
      const value = result[out.getAttribute("name")];
      out.dataset.value = String(value);
      out.value = shown(value, out.dataset);
    }
  }

  function applyPreset(select) {
    const option = select.selectedOptions[0];
    if (!option) return;
    for (const [name, value] of Object.entries(JSON.parse(option.dataset.values))) {
      const el = select.form.elements.namedItem(name);
      if (el) el.value = String(value);
    }
  }

  function init(root) {
    for (const form of root.querySelectorAll("form[data-calculator]")) {
      if (form.dataset.ready || !(form.dataset.calculator in formulas)) continue;
      form.dataset.ready = "1";
      for (const select of form.querySelectorAll("select[data-preset]")) {
        select.addEventListener("change", () => applyPreset(select));
      }
      form.addEventListener("submit", (event) => event.preventDefault());
      form.addEventListener("input", () => update(form));
      form.addEventListener("change", () => update(form));
      update(form);
    }
  }

  if (typeof document$ !== "undefined") {
    document$.subscribe(({ body }) => init(body));
  } else if (typeof document !== "undefined") {
    document.addEventListener("DOMContentLoaded", () => init(document));
  }
})();
