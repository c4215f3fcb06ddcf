// The steps are <section class="step"> elements written by autograd/lesson.py. This script shows
// one at a time and keeps the graph's highlight, the counter and #step=N in the address in step.
// Every sentence is written in English and Chinese (data-lang); the switch sets <html data-ui>,
// and #lang=zh (or en) in the address keeps a language that is not the browser's.
(function () {
  "use strict";
  const steps = Array.from(document.querySelectorAll("section.step"));
  const nodes = Array.from(document.querySelectorAll("#graph .node"));
  const edges = Array.from(document.querySelectorAll("#graph .edge"));
  const prev = document.getElementById("prev");
  const next = document.getElementById("next");
  const counter = document.getElementById("counter");
  const status = document.getElementById("status");
  const root = document.documentElement;
  const browserLang = /^zh/i.test(navigator.language || "") ? "zh" : "en";
  const PHASES = { start: "开始", forward: "前向", backward: "反向", grads: "梯度", update: "更新" };
  const WORDS = {
    en: { copied: "LaTeX copied: ", copy: "Copy this LaTeX: " },
    zh: { copied: "已复制 LaTeX：", copy: "请复制这段 LaTeX：" },
  };
  let current = 0;
  let lang = "en";

  function setLang(to) {
    lang = to === "zh" ? "zh" : "en";
    root.dataset.ui = lang;
    root.lang = lang;
    document.title = root.dataset[lang === "zh" ? "titleZh" : "titleEn"];
    for (const b of document.querySelectorAll("[data-set-lang]")) {
      b.setAttribute("aria-pressed", String(b.dataset.setLang === lang));
    }
  }

  function hashFor(n) {
    return "#step=" + n + (lang === browserLang ? "" : "&lang=" + lang);
  }

  function show(n) {
    current = Math.max(0, Math.min(steps.length - 1, n));
    const step = steps[current];
    const phase = step.dataset.phase;
    steps.forEach((s, i) => { s.hidden = i !== current; });
    document.getElementById("panel").scrollTop = 0; // a new step is read from its top
    // Forward: the ops not computed yet are faded. Backward: the ops whose gradient is known
    // so far, and the leaves given one, are outlined. Both are read off the steps up to this one.
    const computed = new Set();
    const graded = new Set();
    for (const s of steps.slice(0, current + 1)) {
      if (s.dataset.phase === "forward") computed.add(s.dataset.node);
      if (s.dataset.phase === "backward") graded.add(s.dataset.node);
      s.dataset.marked.split(" ").forEach((id) => graded.add(id));
    }
    const forward = phase === "start" || phase === "forward";
    for (const node of nodes) {
      const op = node.classList.contains("op");
      node.classList.toggle("pending", forward && op && !computed.has(node.id));
      node.classList.toggle("has-grad", graded.has(node.id));
      node.classList.toggle("current", node.id === step.dataset.node);
    }
    const active = new Set(step.dataset.edges.split(" ").filter(Boolean).map((i) => "e" + i));
    for (const edge of edges) {
      edge.classList.toggle("active", active.has(edge.id));
      edge.classList.toggle("grad", phase === "backward");
    }
    const last = steps.length - 1;
    counter.textContent = lang === "zh"
      ? "第 " + current + " 步，共 " + last + " 步 \u00b7 " + (PHASES[phase] || phase)
      : "step " + current + " of " + last + " \u00b7 " + phase;
    prev.disabled = current === 0;
    next.disabled = current === steps.length - 1;
    if (location.hash !== hashFor(current)) history.replaceState(null, "", hashFor(current));
    const highlighted = document.getElementById(step.dataset.node);
    if (highlighted) highlighted.scrollIntoView({ block: "nearest", inline: "nearest" });
  }

  function fromHash() {
    const match = /step=(\d+)/.exec(location.hash);
    const language = /lang=(en|zh)/.exec(location.hash);
    setLang(language ? language[1] : browserLang);
    return match ? Number(match[1]) : 0;
  }

  function say(text) {
    status.textContent = text;
    status.classList.add("shown");
    clearTimeout(say.timer);
    say.timer = setTimeout(() => status.classList.remove("shown"), 2500);
  }

  // navigator.clipboard needs a secure context and permission; the textarea route works from disk.
  function copy(text) {
    const fallback = () => {
      const area = document.createElement("textarea");
      area.value = text;
      document.body.appendChild(area);
      area.select();
      const ok = document.execCommand("copy");
      area.remove();
      say((ok ? WORDS[lang].copied : WORDS[lang].copy) + text);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(() => say(WORDS[lang].copied + text), fallback);
    } else {
      fallback();
    }
  }

  prev.addEventListener("click", () => show(current - 1));
  next.addEventListener("click", () => show(current + 1));
  document.addEventListener("keydown", (event) => {
    if (event.altKey || event.ctrlKey || event.metaKey) return;
    const to = { ArrowRight: current + 1, ArrowLeft: current - 1, Home: 0, End: steps.length - 1 };
    if (event.key in to) {
      event.preventDefault();
      show(to[event.key]);
    }
  });
  document.addEventListener("click", (event) => {
    const switcher = event.target.closest("[data-set-lang]");
    if (switcher) {
      setLang(switcher.dataset.setLang);
      return show(current);
    }
    const formula = event.target.closest(".formula");
    if (formula) copy(formula.dataset.latex);
    // A box opens its op's step in the pass being shown (the forward one from the start).
    const node = event.target.closest("#graph .node");
    if (!node) return;
    const backward = !["start", "forward"].includes(steps[current].dataset.phase);
    const phases = backward ? ["backward", "forward"] : ["forward", "backward"];
    for (const phase of phases) {
      const i = steps.findIndex((s) => s.dataset.node === node.id && s.dataset.phase === phase);
      if (i >= 0) return show(i);
    }
  });
  window.addEventListener("hashchange", () => show(fromHash()));
  show(fromHash());
})();
