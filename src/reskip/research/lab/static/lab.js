"use strict";
let state = null;

function el(id) { return document.getElementById(id); }
function esc(s) { const d = document.createElement("div"); d.textContent = String(s); return d.innerHTML; }
function fmt(x, d) { return (x === null || x === undefined) ? "-" : Number(x).toFixed(d); }

async function load() {
  const r = await fetch("/api/state");
  state = await r.json();
  const b = state.baseline;
  el("baseline").innerHTML = "<b>Baseline:</b> " + esc(JSON.stringify(b.policy)) + ", window " + b.window +
    ", c(t) " + b.curriculum + ", skip path " + esc(b.skip_path) + (b.budget !== null ? ", budget " + b.budget : "") +
    "; " + state.n_blocks + " blocks; stored budgets: " + esc(state.budgets.join(", ") || "none");
  const sel = el("variable");
  for (const [name, help] of Object.entries(state.variables)) {
    const o = document.createElement("option"); o.value = name; o.textContent = name; o.title = help; sel.appendChild(o);
  }
  sel.onchange = () => { el("help").textContent = state.variables[sel.value]; };
  sel.onchange();
  el("block").max = state.n_blocks;
  state.samples.forEach((t, i) => {
    const o = document.createElement("option"); o.value = String(i); o.textContent = "test text " + (i + 1);
    el("samples").appendChild(o);
  });
  el("samples").onchange = () => { const i = el("samples").value; if (i !== "") el("text").value = state.samples[Number(i)]; };
  renderHistory(state.history);
}

function renderHistory(h) {
  if (!h.length) { el("history").textContent = "no run yet"; return; }
  let rows = "<table><tr><th>#</th><th>change</th><th>predicted</th><th>measured</th><th>ppl base -> changed</th>" +
    "<th>delta %</th><th>top-1 changed</th><th>decisions flipped</th><th>prediction</th></tr>";
  h.forEach((e, i) => {
    const c = e.change, m = e.measured, p = e.prediction;
    rows += "<tr><td>" + (i + 1) + "</td><td>" + esc(c.variable + (c.block !== undefined ? " (block " + c.block + ")" : "") +
      " = " + c.value) + "</td><td>" + esc(p.direction + (p.amount_percent !== null ? " ~" + p.amount_percent + "%" : "")) +
      "</td><td>" + esc(m.direction) + "</td><td>" + fmt(m.ppl_base, 3) + " -> " + fmt(m.ppl_changed, 3) + "</td><td>" +
      fmt(m.delta_percent, 2) + "</td><td>" + m.top1_changed + "</td><td>" + m.decisions_flipped + "</td><td class='" +
      (e.prediction_right ? "right'>right" : "wrong'>wrong") + "</td></tr>";
  });
  el("history").innerHTML = rows + "</table>";
}

function renderTokens(r) {
  const flipped = new Set(r.flipped_tokens);
  let html = "";
  r.tokens.forEach((t, i) => {
    const sk = r.changed.skipped[i] || [], w = r.changed.w_recent[i] || {};
    const tip = "token " + i + ": skipped " + JSON.stringify(sk) + " (baseline " + JSON.stringify(r.base.skipped[i] || []) +
      "); w_recent " + Object.entries(w).map(([n, v]) => n + ": " + Number(v).toFixed(3) +
      (r.tau[n] !== undefined ? " vs tau " + Number(r.tau[n]).toFixed(3) : "")).join(", ");
    html += "<span class='tok s" + Math.min(sk.length, 3) + (flipped.has(i) ? " flip" : "") + "' title='" + esc(tip) +
      "' data-index='" + i + "'>" + esc(t) + "</span>";
  });
  el("tokens").innerHTML = html;
}

// The request is typed (the lab coerces nothing): a field that reads as a number is sent as one, any other text as
// text (a word value such as "always", or something the lab will refuse with its reason); empty is no value.
function typed(text) {
  const t = text.trim();
  if (t === "") return null;
  return isNaN(Number(t)) ? t : Number(t);
}

async function run() {
  el("error").textContent = ""; el("result").innerHTML = "";
  const checked = document.querySelector("input[name=direction]:checked");
  const body = {
    text: el("text").value,
    change: {variable: el("variable").value, value: typed(el("value").value), block: typed(el("block").value)},
    prediction: {direction: checked ? checked.value : null, amount_percent: typed(el("amount").value)},
  };
  el("run").disabled = true; el("status").textContent = "running on the model...";
  try {
    const r = await fetch("/api/run", {method: "POST", headers: {"Content-Type": "application/json"},
                                       body: JSON.stringify(body)});
    const data = await r.json();
    if (!r.ok || data.error) { el("error").textContent = data.error || ("the server answered " + r.status); return; }
    const m = data.measured;
    el("result").innerHTML = "<p id='delta'><b>Measured:</b> perplexity " + fmt(m.ppl_base, 3) + " -> " +
      fmt(m.ppl_changed, 3) + " (" + fmt(m.delta_percent, 2) + "%, " + esc(m.direction) + "); " + m.top1_changed +
      " top-1 tokens changed; " + m.decisions_flipped + " tokens' decisions flipped; blocks skipped per token " +
      fmt(m.mean_skipped_base, 2) + " -> " + fmt(m.mean_skipped_changed, 2) + ". <b>Your prediction</b> (" +
      esc(data.prediction.direction) + ") was <span class='" + (data.prediction_right ? "right'>right" : "wrong'>wrong") +
      "</span>" + (data.amount_error_percent !== null ? ", off by " + fmt(Math.abs(data.amount_error_percent), 2) +
      " points of perplexity change" : "") + ".</p>";
    renderTokens(data);
    renderHistory(data.history);
  } catch (e) {
    el("error").textContent = "the lab server did not answer: " + e;
  } finally {
    el("run").disabled = false; el("status").textContent = "";
  }
}

el("run").onclick = run;
load();
