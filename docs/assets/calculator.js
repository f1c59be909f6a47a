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

  // ---- posts/quality-metrics: snippets/quality_metrics/calculators.py, with wer.py ----

  // words, chars
  const WHITESPACE = " \t\n\r\f\v";
  const words = (text) => text.split(/[ \t\n\r\f\v]+/).filter((w) => w !== "");
  function chars(text) {
    let a = 0;
    let b = text.length;
    while (a < b && WHITESPACE.includes(text[a])) a++;
    while (b > a && WHITESPACE.includes(text[b - 1])) b--;
    return [...text.slice(a, b)]; // code points, as Python's list(str)
  }

  // align (the dynamic program and its tie-breaking), Alignment.rate
  function align(ref, hyp) {
    const n = ref.length;
    const m = hyp.length;
    const d = [];
    for (let i = 0; i <= n; i++) {
      d.push([]);
      for (let j = 0; j <= m; j++) d[i].push(i === 0 || j === 0 ? i + j : 0);
    }
    for (let i = 1; i <= n; i++) {
      for (let j = 1; j <= m; j++) {
        const diag = d[i - 1][j - 1] + (ref[i - 1] === hyp[j - 1] ? 0 : 1);
        d[i][j] = Math.min(diag, d[i - 1][j] + 1, d[i][j - 1] + 1);
      }
    }
    const ops = [];
    let i = n;
    let j = m;
    while (i > 0 || j > 0) {
      if (i > 0 && d[i][j] === d[i - 1][j] + 1) {
        ops.push(["D", ref[i - 1], null]);
        i -= 1;
      } else if (i > 0 && j > 0 && d[i][j] === d[i - 1][j - 1] + (ref[i - 1] !== hyp[j - 1] ? 1 : 0)) {
        ops.push([ref[i - 1] === hyp[j - 1] ? "=" : "S", ref[i - 1], hyp[j - 1]]);
        i -= 1;
        j -= 1;
      } else {
        ops.push(["I", null, hyp[j - 1]]);
        j -= 1;
      }
    }
    return ops.reverse();
  }

  const count = (ops, kind) => ops.filter((op) => op[0] === kind).length;

  // WIDE, display_width, render
  const WIDE = [[0x1100, 0x115f], [0x2e80, 0x303e], [0x3041, 0x3247], [0x3250, 0x33ff],
    [0x3400, 0x4dbf], [0x4e00, 0x9fff], [0xa000, 0xa4cf], [0xac00, 0xd7a3], [0xf900, 0xfaff],
    [0xfe30, 0xfe4f], [0xff00, 0xff60], [0xffe0, 0xffe6], [0x20000, 0x2fffd], [0x30000, 0x3fffd]];
  function displayWidth(token) {
    let width = 0;
    for (const c of token) {
      const code = c.codePointAt(0);
      width += WIDE.some(([a, b]) => a <= code && code <= b) ? 2 : 1;
    }
    return width;
  }

  function render(ops, sep) {
    const rows = [["REF:"], ["HYP:"], ["    "]];
    for (const [kind, r0, h0] of ops) {
      const width = Math.max(displayWidth(r0 ?? ""), displayWidth(h0 ?? ""));
      const cells = [r0 ?? "*".repeat(width), h0 ?? "*".repeat(width), kind === "=" ? "" : kind];
      cells.forEach((cell, k) => rows[k].push(" ".repeat(width - displayWidth(cell)) + cell));
    }
    return rows.map((row) => `${row[0]} ${row.slice(1).join(sep)}`.replace(/ +$/, "")).join("\n");
  }

  // wer_calculator
  function werCalculator(x) {
    const out = {};
    for (const [unit, split, sep] of [["word", words, " "], ["char", chars, ""]]) {
      const ops = align(split(x.reference), split(x.hypothesis));
      const [hits, subs, dels, ins] = ["=", "S", "D", "I"].map((kind) => count(ops, kind));
      if (hits + subs + dels === 0) throw new RangeError("the reference is empty");
      out[`${unit}_rate`] = (subs + dels + ins) / (hits + subs + dels);
      out[`${unit}_substitutions`] = subs;
      out[`${unit}_deletions`] = dels;
      out[`${unit}_insertions`] = ins;
      out[`${unit}_hits`] = hits;
      out[`${unit}_alignment`] = render(ops, sep);
    }
    return out;
  }

  // ---- posts/speculative-decoding: snippets/speculative_decoding/calculators.py, with theory.py ----

  // expected_tokens, walltime_speedup, optimal_gamma (theory.py)
  function expectedTokens(alpha, gamma) {
    if (!(alpha >= 0 && alpha <= 1)) throw new RangeError(`alpha must lie in [0, 1], got ${alpha}`);
    if (!(gamma >= 0) || gamma !== Math.trunc(gamma)) throw new RangeError("gamma must be a whole number >= 0");
    if (alpha === 1) return gamma + 1;
    let power = 1;
    for (let i = 0; i < gamma + 1; i++) power *= alpha; // products, as in Python
    return (1 - power) / (1 - alpha);
  }

  function walltimeSpeedup(alpha, gamma, c) {
    if (!(c >= 0)) throw new RangeError(`the cost ratio c must be >= 0, got ${c}`);
    return expectedTokens(alpha, gamma) / (gamma * c + 1);
  }

  // speculative_calculator
  function speculative(x) {
    whole("gamma + 1", x.gamma + 1);
    let best = 1;
    let bestSpeedup = walltimeSpeedup(x.alpha, 1, x.c);
    for (let g = 2; g <= 64; g++) {
      const s = walltimeSpeedup(x.alpha, g, x.c);
      if (s > bestSpeedup) [best, bestSpeedup] = [g, s]; // ties keep the smaller gamma
    }
    return {
      tokens: expectedTokens(x.alpha, x.gamma),
      speedup: walltimeSpeedup(x.alpha, x.gamma, x.c),
      operations: (x.gamma * x.c_hat + x.gamma + 1) / expectedTokens(x.alpha, x.gamma),
      best_gamma: best,
      best_speedup: bestSpeedup,
      gamma_one: (1 + x.alpha) / (1 + x.c),
      free_draft: x.alpha < 1 ? 1 / (1 - x.alpha) : null,
    };
  }


  // ---- posts/moe-distillation: snippets/moe_distillation/calculators.py, with account.py ----

  // --8<-- [start:distill]
  // distill_calculator, with bytes_per_token, distill_flops_per_token and gpus_to_hold
  function distill(x) {
    if (!(1 <= x.k && x.k <= x.vocab)) throw new RangeError(`k must be in [1, vocab = ${x.vocab}]`);
    const full = x.vocab * x.value_bytes;
    const topk = x.k * (x.value_bytes + x.id_bytes);
    const teacher = 2 * (x.teacher_n_b * 1e9);
    const student = 6 * (x.student_n_b * 1e9);
    const tokens = x.tokens_b * 1e9;
    const rate = x.peak_tflops * 1e12 * x.mfu; // sustained FLOP/s of one GPU
    return {
      full_bytes: full,
      topk_bytes: topk,
      ratio: full / topk,
      full_store: tokens * full,
      topk_store: tokens * topk,
      teacher_flops: teacher,
      student_flops: student,
      teacher_share: teacher / (teacher + student),
      offline_gpu_h: (tokens * teacher) / rate / 3600,
      online_gpu_h: (x.epochs * tokens * teacher) / rate / 3600,
      student_gpu_h: (x.epochs * tokens * student) / rate / 3600,
      teacher_gpus: Math.ceil((x.teacher_total_b * 1e9 * x.weight_bytes) / (x.memory_gb * 1e9)),
    };
  }
  // --8<-- [end:distill]

  const formulas = {
    mfu, zero, busbw, "kv-cache": kvCache, wer: werCalculator, speculative, distill,
  };
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
