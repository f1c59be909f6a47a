// The efficiency calculator of posts/metrics: MFU, ZeRO model-state memory, collective busbw.
// The formulas mirror snippets/metrics/*.py term by term (same operations, same order), and are
// checked against the Python functions on tests/fixtures/metrics_vectors.json in a browser.
// No third-party code. Re-initialised on every page load, including Material's instant navigation.
(() => {
  "use strict";

  // BEGIN GPU PRESETS (generated from data/hardware.yaml by snippets/metrics/vectors.py)
  const GPUS = [
    { id: "h100-sxm", name: "NVIDIA H100 SXM", bf16DenseTflops: 989.5, hbmTbPerS: 3.35, memoryGb: 80 },
    { id: "h100-pcie", name: "NVIDIA H100 PCIe", bf16DenseTflops: 756.5, hbmTbPerS: 2.0, memoryGb: 80 },
    { id: "h200-sxm", name: "NVIDIA H200 SXM", bf16DenseTflops: 989.5, hbmTbPerS: 4.8, memoryGb: 141 },
    { id: "a100-sxm-80gb", name: "NVIDIA A100 80GB SXM", bf16DenseTflops: 312, hbmTbPerS: 2.039, memoryGb: 80 },
    { id: "b200", name: "NVIDIA B200", bf16DenseTflops: 2250, hbmTbPerS: 7.7, memoryGb: 180 },
  ];
  // END GPU PRESETS

  // ---- formulas (each takes one object; names as in tests/fixtures/metrics_vectors.json) ----

  // PaLM App. B: 6N + 12 L H Q T training FLOPs per token (layers = 0 gives plain 6N).
  function flopsPerToken({ params, layers = 0, heads = 0, headDim = 0, seqLen = 0 }) {
    return 6 * params + 12 * layers * heads * headDim * seqLen;
  }

  // Model FLOPs utilization: required FLOP/s over the chips' peak FLOP/s.
  function mfu({ tokensPerSecond, flopsPerToken, chips, peakFlops }) {
    return (tokensPerSecond * flopsPerToken) / (chips * peakFlops);
  }

  // Tokens per GPU per second.
  function tgs({ tokens, seconds, gpus }) {
    return tokens / seconds / gpus;
  }

  // ZeRO (arXiv:1910.02054) Figure 1: model-state bytes per GPU; stage 0 = plain data parallel.
  function zeroMemory({ params, dataParallel, stage, k = 12 }) {
    const psi = params;
    const nd = dataParallel;
    switch (Number(stage)) {
      case 0:
        return (2 + 2 + k) * psi;
      case 1:
        return 2 * psi + 2 * psi + (k * psi) / nd;
      case 2:
        return 2 * psi + ((2 + k) * psi) / nd;
      case 3:
        return ((2 + 2 + k) * psi) / nd;
      default:
        throw new RangeError(`ZeRO stage must be 0, 1, 2 or 3, not ${stage}`);
    }
  }

  // nccl-tests doc/PERFORMANCE.md: busbw = algbw x factor for n ranks.
  function busFactor({ op, ranks }) {
    const n = ranks;
    const factors = {
      all_reduce: (2 * (n - 1)) / n,
      reduce_scatter: (n - 1) / n,
      all_gather: (n - 1) / n,
      all_to_all: (n - 1) / n,
      broadcast: 1.0,
      reduce: 1.0,
    };
    if (!(op in factors)) throw new RangeError(`unknown collective ${op}`);
    return factors[op];
  }

  function busbw({ algbw, ranks, op }) {
    return algbw * busFactor({ op, ranks });
  }

  // Roofline: min(peak, arithmetic intensity x bandwidth).
  function attainableFlops({ intensity, peakFlops, bandwidth }) {
    return Math.min(peakFlops, intensity * bandwidth);
  }

  window.handbookCalculator = Object.freeze({
    flopsPerToken,
    mfu,
    tgs,
    zeroMemory,
    busFactor,
    busbw,
    attainableFlops,
    gpus: GPUS,
  });

  // ---- the forms on the page ----

  const num = (form, name) => Number(form.elements[name].value);
  const show = (form, name, text) => {
    const out = form.querySelector(`output[name="${name}"]`);
    if (out) out.value = text;
  };
  const fixed = (x, digits) => (Number.isFinite(x) ? x.toFixed(digits) : "—");
  const percent = (x) => (Number.isFinite(x) ? `${(100 * x).toFixed(1)} %` : "—");

  function fillGpuSelect(form) {
    const select = form.elements.gpu;
    if (!select || select.options.length) return;
    for (const gpu of GPUS) select.add(new Option(gpu.name, gpu.id, false, gpu.id === "h200-sxm"));
  }

  const gpuOf = (form) => GPUS.find((g) => g.id === form.elements.gpu.value);

  const UPDATE = {
    mfu(form) {
      const gpu = gpuOf(form);
      if (gpu && form.dataset.gpuApplied !== gpu.id) {
        form.elements.peakTflops.value = gpu.bf16DenseTflops;
        form.dataset.gpuApplied = gpu.id;
      }
      const params = num(form, "paramsB") * 1e9;
      const six = flopsPerToken({ params });
      const palm = flopsPerToken({
        params,
        layers: num(form, "layers"),
        heads: num(form, "heads"),
        headDim: num(form, "headDim"),
        seqLen: num(form, "seqLen"),
      });
      const common = { tokensPerSecond: num(form, "tgs"), chips: 1, peakFlops: num(form, "peakTflops") * 1e12 };
      show(form, "flops6n", fixed(six / 1e9, 2));
      show(form, "flopsPalm", fixed(palm / 1e9, 2));
      show(form, "mfu6n", percent(mfu({ ...common, flopsPerToken: six })));
      show(form, "mfuPalm", percent(mfu({ ...common, flopsPerToken: palm })));
    },
    zero(form) {
      const gpu = gpuOf(form);
      const args = { params: num(form, "paramsB") * 1e9, dataParallel: num(form, "dataParallel"), k: num(form, "k") };
      for (const stage of [0, 1, 2, 3]) {
        const gb = zeroMemory({ ...args, stage }) / 1e9;
        const share = gpu ? ` (${percent(gb / gpu.memoryGb)})` : "";
        show(form, `stage${stage}`, `${fixed(gb, 1)} GB${share}`);
      }
    },
    busbw(form) {
      const seconds = num(form, "ms") / 1e3;
      const alg = (num(form, "sizeGB") * 1e9) / seconds;
      show(form, "algbw", fixed(alg / 1e9, 1));
      show(form, "busbw", fixed(busbw({ algbw: alg, ranks: num(form, "ranks"), op: form.elements.op.value }) / 1e9, 1));
    },
  };

  function init(root) {
    for (const form of root.querySelectorAll("form[data-calculator]")) {
      const update = UPDATE[form.dataset.calculator];
      if (!update || form.dataset.ready) continue;
      form.dataset.ready = "1";
      fillGpuSelect(form);
      form.addEventListener("submit", (event) => event.preventDefault());
      form.addEventListener("input", () => update(form));
      form.addEventListener("change", () => update(form));
      update(form);
    }
  }

  if (typeof document$ !== "undefined") {
    document$.subscribe(({ body }) => init(body));
  } else {
    document.addEventListener("DOMContentLoaded", () => init(document));
  }
})();
