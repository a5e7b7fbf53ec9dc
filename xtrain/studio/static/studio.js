// xtrain studio's page: plain JavaScript, no build step, nothing fetched but the studio's own API.
// Every text from a run or a form goes into the page as text (textContent); the HTML the server
// sends (the report's curves and sections, the data check) is escaped where it is made.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const state = { catalog: null, runs: [], view: "", run: null, source: null, stages: 0 };

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) node.append(c instanceof Node ? c : document.createTextNode(String(c ?? "")));
  return node;
}

async function api(path, body) {
  const opts = body === undefined ? {} : {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
  };
  const answer = await fetch(path, opts);
  let data;
  try { data = await answer.json(); } catch (e) { data = { error: `the studio answered ${answer.status}` }; }
  if (!answer.ok || (data && data.error)) throw new Error(data.error || `the studio answered ${answer.status}`);
  return data;
}

function say(error) {
  const box = $("#error");
  box.textContent = error ? String(error.message || error) : "";
  box.hidden = !error;
}

async function guarded(button, wait, work) {
  say(null);
  if (button) button.disabled = true;
  if (wait) wait.textContent = "working…";
  try { return await work(); } catch (e) { say(e); return null; } finally {
    if (button) button.disabled = false;
    if (wait) wait.textContent = "";
  }
}

function copy(text) {
  if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
  const area = el("textarea", {}, text);
  document.body.append(area);
  area.select();
  document.execCommand("copy");
  area.remove();
  return Promise.resolve();
}

function copyButton(text) {
  return el("button", { type: "button", class: "copy", onclick: () => copy(text) }, "Copy");
}

const runPath = (path) => `path=${encodeURIComponent(path)}`;

// -- views ---------------------------------------------------------------------------------------
function route() {
  const hash = decodeURIComponent(location.hash.slice(1));
  const [view, arg] = hash.includes("=") ? [hash.slice(0, hash.indexOf("=")), hash.slice(hash.indexOf("=") + 1)] : [hash || "runs", ""];
  if (state.source) { state.source.close(); state.source = null; }
  for (const node of document.querySelectorAll(".view")) node.hidden = true;
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("on", a.id === `nav-${view}`);
  say(null);
  state.view = view;
  if (view === "run") { $("#view-run").hidden = false; showRun(arg); }
  else if (view === "new") { $("#view-new").hidden = false; showNew(); }
  else if (view === "compare") { $("#view-compare").hidden = false; showCompare(arg ? arg.split("|") : []); }
  else if (view === "machine") { $("#view-machine").hidden = false; }
  else { $("#view-runs").hidden = false; showRuns(); }
}

// -- runs ------------------------------------------------------------------------------------------
function badge(st) { return el("span", { class: `badge ${st.state}` }, st.stopping ? "stopping" : st.state); }
function steps(st) { return st.step === null || st.step === undefined ? "-" : `${st.step}${st.total ? " / " + st.total : ""}`; }

async function loadRuns() {
  const data = await api("/api/runs");
  state.runs = data.runs;
  $("#root").textContent = data.root;
  return data.runs;
}

async function showRuns() {
  const found = await guarded(null, null, loadRuns);
  if (!found) return;
  const body = $("#runs-table tbody");
  body.replaceChildren(...found.map((r) => el("tr", {},
    el("td", {}, el("input", { type: "checkbox", "data-path": r.path })),
    el("td", {}, el("a", { href: `#run=${encodeURIComponent(r.path)}` }, r.path)),
    el("td", {}, badge(r.status), r.status.line ? el("div", { class: "dim" }, r.status.line) : ""),
    el("td", {}, r.task), el("td", {}, r.model), el("td", {}, steps(r.status)),
    el("td", {}, r.modified ? new Date(r.modified * 1000).toLocaleString() : "-"))));
  $("#runs-empty").hidden = found.length > 0;
  clearTimeout(state.runsTimer);  // one refresh pending at a time, while the list is shown
  if (state.view === "runs") state.runsTimer = setTimeout(() => { if (state.view === "runs") refreshRuns(); }, 3000);
}

async function refreshRuns() {  // the statuses again, the ticks kept
  const ticked = new Set([...document.querySelectorAll("#runs-table input:checked")].map((i) => i.dataset.path));
  await showRuns();
  for (const box of document.querySelectorAll("#runs-table input")) box.checked = ticked.has(box.dataset.path);
}

// -- one run ---------------------------------------------------------------------------------------
function setStatus(st) {
  $("#run-status").replaceChildren(badge(st));
  $("#run-status").className = "";
  $("#run-line").textContent = st.line || "";
  const at = st.step !== null && st.step !== undefined ? `step ${steps(st)}` : "";
  $("#run-meta").textContent = `${state.lineage || ""}${at}`;
  const active = st.state === "running" || st.state === "starting";
  $("#run-stop").disabled = !active || st.stopping;
  $("#run-resume").disabled = active || !["stopped", "interrupted", "failed", "not started"].includes(st.state);
  const done = st.state === "finished";
  $("#run-try").hidden = !done || !state.canTry;  // (a task xtrain predict cannot run: no Try)
  $("#run-export").hidden = !done;
}

async function showRun(path) {
  state.run = path;
  $("#run-name").textContent = path;
  $("#run-curves").replaceChildren();
  $("#run-log").textContent = "";  // the stream's first event brings the log's end
  $("#try-answers").hidden = true;
  const data = await guarded(null, null, () => api(`/api/run?${runPath(path)}`));
  if (!data) return;
  state.runData = data;
  setupTry(data.task);
  state.lineage = data.lineage.length ? `continues ${data.lineage.join(" → ")}; ` : "";
  $("#run-chain").hidden = !data.lineage.length;
  setStatus(data.status);
  $("#run-config").textContent = data.config || "(no YAML saved by the studio: see its checkpoints' config)";
  $("#run-report-link").hidden = !data.report;
  $("#run-report-link").href = `/api/run/file?${runPath(path)}&name=report.html`;
  showExports(data.exports);
  const source = new EventSource(`/api/run/events?${runPath(path)}`);
  state.source = source;
  source.addEventListener("open", () => { $("#run-log").textContent = ""; });  // each (re)connection: the log's end again
  source.addEventListener("curves", (e) => { $("#run-curves").innerHTML = JSON.parse(e.data).html; });
  source.addEventListener("status", (e) => setStatus(JSON.parse(e.data).runs[0]));
  source.addEventListener("log", (e) => {
    const log = $("#run-log");
    const end = log.scrollTop + log.clientHeight >= log.scrollHeight - 20;
    const first = !log.textContent;
    log.textContent = (log.textContent + JSON.parse(e.data).text).slice(-60000);
    if (end || first) log.scrollTop = log.scrollHeight;
  });
}

function setupTry(task) {
  const found = (state.catalog?.tasks || []).find((t) => t.name === task);
  const takes = found ? found.takes : { text: true, image: false, audio: false, tools: false };
  $("#try-prompt-box").hidden = !takes.text;
  $("#try-system-box").hidden = !takes.text;
  $("#try-image-box").hidden = !takes.image;
  $("#try-audio-box").hidden = !takes.audio;
  $("#try-tools-box").hidden = !takes.tools;
  state.canTry = takes.text || takes.image || takes.audio;
}

function readFile(input) {
  const file = input.files && input.files[0];
  if (!file) return Promise.resolve(null);
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve({ name: file.name, data: String(reader.result).split(",")[1] || "" });
    reader.onerror = () => reject(new Error(`${file.name} could not be read`));
    reader.readAsDataURL(file);
  });
}

// a predict row's answer as text: its output (with its probability for a label), else its fields
function answerText(row) {
  if (!row) return "";
  const out = row.output ?? row.text;
  if (out === undefined) {
    const { input, prompt, ...rest } = row;
    return JSON.stringify(rest);
  }
  const shown = row.probability !== undefined ? `${out} (${row.probability})` : String(out);
  return row.call ? `${shown}\ncall: ${JSON.stringify(row.call)}` : shown;  // a tool call parsed from it
}

async function tryRun() {
  const body = {
    prompt: $("#try-prompt").value, system: $("#try-system").value, tools: $("#try-tools").value,
    max_new_tokens: $("#try-tokens").value,
    image: await readFile($("#try-image")), audio: await readFile($("#try-audio")),
  };
  const answer = await api(`/api/run/try?${runPath(state.run)}`, body);
  $("#try-start-head").textContent = `start: ${answer.start}`;
  const rows = answer.trained.map((row, i) => el("tr", {},
    el("td", {}, row.input || row.prompt || ""),
    el("td", {}, answerText(answer.base[i])),
    el("td", {}, answerText(row))));
  $("#try-answers tbody").replaceChildren(...rows);
  $("#try-answers").hidden = false;
}

const TYPES = ["q8_0", "q4_k_m", "q5_k_m", "q6_k", "q4_0", "f16", "bf16"];

function showExports(found) {
  if (!$("#export-types").childElementCount) {
    $("#export-types").append("GGUF types: ", ...TYPES.map((t) => el("label", {},
      el("input", { type: "checkbox", value: t, checked: t === "q8_0" }), ` ${t}`)));
  }
  $("#export-list").replaceChildren(...(found || []).map(exportBlock));
  if ((found || []).some((e) => e.state === "running") && state.view === "run") {
    setTimeout(async () => {
      if (state.view !== "run") return;
      const data = await api(`/api/run?${runPath(state.run)}`).catch(() => null);
      if (data) showExports(data.exports);
    }, 2000);
  }
}

function exportBlock(e) {
  const a = e.answer || {};
  const parts = [el("h3", {}, e.name, " ", el("span", { class: `badge ${e.state}` }, e.state))];
  if (a.error) parts.push(el("p", { class: "line" }, a.error));
  if (a.checks) parts.push(el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "check"), el("th", {}, "result"))),
    el("tbody", {}, a.checks.map((c) => el("tr", {}, el("td", {}, `ok ${c.name}`), el("td", {}, c.detail))))));
  for (const line of a.costs || []) parts.push(el("p", {}, `cost ${line}`));
  for (const line of a.warnings || []) parts.push(el("p", { class: "warn" }, `warning: ${line}`));
  if (a.answers) parts.push(el("table", { class: "answers" },
    el("thead", {}, el("tr", {}, a.answers.head.map((h) => el("th", {}, h)))),
    el("tbody", {}, a.answers.rows.map((r) => el("tr", {}, r.map((c) => el("td", {}, c)))))));
  if (a.files) parts.push(el("ul", {}, Object.entries(a.files).map(([f, n]) => el("li", {}, `${a.output}/${f} (${(n / 1048576).toFixed(1)} MiB)`))));
  if (a.ollama) parts.push(el("pre", { class: "code" }, Object.values(a.ollama)[0]));
  return el("div", { class: "export" }, parts);
}

// -- a new run -------------------------------------------------------------------------------------
function keyInfo(key) { return state.catalog.keys.find((k) => k.key === key) || { default: "", choices: [] }; }

function field(key, initial) {
  const info = keyInfo(key);
  const attrs = { "data-key": key, "data-initial": initial, value: initial, placeholder: info.default };
  if (key === "model.name_or_path") attrs.list = "models";
  else if (info.choices.length) attrs.list = `choices-${key}`;
  return el("input", attrs);
}

// "All keys" for the stage's task: its own keys first, the common ones after, another task's hidden
// (moved, never rebuilt: what was typed stays)
function showTaskKeys(block) {
  const cat = state.catalog;
  const own = new Set((cat.tasks.find((t) => t.name === $(".task", block).value) || { keys: [] }).keys);
  const specific = new Set(cat.specific);
  const rows = [...block.querySelectorAll(".keys tr[data-row]")];
  for (const row of rows) row.hidden = specific.has(row.dataset.row) && !own.has(row.dataset.row);
  const body = $(".keys tbody", block);
  body.append(...rows.filter((r) => own.has(r.dataset.row)), ...rows.filter((r) => !own.has(r.dataset.row)));
}

function stageBlock(number) {
  const cat = state.catalog;
  const jobs = el("select", { class: "job" }, el("option", { value: "" }, "(a task with my own model and data)"),
    Object.entries(cat.jobs).map(([name, job]) => el("option", { value: name }, `built-in job: ${name} (${job.about})`)));
  const task = el("select", { class: "task" }, cat.tasks.map((t) => el("option", { value: t.name, title: t.about }, t.name)));
  const block = el("div", { class: "stage", "data-number": number },
    el("h2", {}, number === 1 ? "Stage 1" : `Stage ${number} (from stage ${number - 1}'s result)`),
    el("p", {}, el("label", {}, "Start from ", jobs), el("label", {}, "Task ", task)),
    el("div", { class: "fields" }),
    el("details", {}, el("summary", {}, "All keys"), el("table", { class: "keys" }, el("tbody"))));
  const fill = () => {
    const job = cat.jobs[jobs.value];
    if (job) task.value = job.task;
    task.disabled = Boolean(job);
    const values = job ? job.values : (number > 1 ? { "model.name_or_path": "previous" } : {});
    $(".fields", block).replaceChildren(...cat.main.map((k) => el("label", {}, el("span", { class: "dim" }, k), el("br"), field(k, values[k] ?? ""))));
    $(".keys tbody", block).replaceChildren(...cat.keys.filter((k) => !cat.main.includes(k.key)).map((k) =>
      el("tr", { "data-row": k.key }, el("td", {}, k.key), el("td", {}, field(k.key, values[k.key] ?? "")), el("td", { class: "dim" }, k.choices.join(" | ")))));
    showTaskKeys(block);
  };
  jobs.addEventListener("change", fill);
  task.addEventListener("change", () => showTaskKeys(block));
  if (number === 1) jobs.value = cat.default_job;
  fill();
  return block;
}

function useCatalog(cat) {  // the form's lists: models at hand, each key's choices
  state.catalog = cat;
  $("#models").replaceChildren(...[...cat.models, ...cat.trained].map((m) => el("option", { value: m })));
  for (const k of cat.keys.filter((k) => k.choices.length)) {
    document.body.append(el("datalist", { id: `choices-${k.key}` }, k.choices.map((c) => el("option", { value: c }))));
  }
}

async function showNew() {
  if (!state.catalog) {
    const cat = await guarded(null, null, () => api("/api/catalog"));
    if (!cat) return;
    useCatalog(cat);
  }
  $("#new-root").textContent = state.catalog.runs_folder;
  if (!$("#new-name").value) $("#new-name").value = `run-${new Date().toISOString().slice(0, 16).replace(/[-:T]/g, "")}`;
  if (!$("#stages").childElementCount) addStage();
}

function addStage() {
  state.stages += 1;
  $("#stages").append(stageBlock(state.stages));
  $("#stage-remove").hidden = state.stages < 2;
}

function removeStage() {
  if (state.stages < 2) return;
  $("#stages").lastElementChild.remove();
  state.stages -= 1;
  $("#stage-remove").hidden = state.stages < 2;
}

function formValues() {
  const stages = [...document.querySelectorAll("#stages .stage")].map((block) => {
    const values = {};
    for (const input of block.querySelectorAll("input[data-key]")) {
      if (input.closest("tr[hidden]")) continue;  // another task's key
      if (input.value !== input.dataset.initial) values[input.dataset.key] = input.value;
    }
    return { job: $(".job", block).value || null, task: $(".task", block).value, values };
  });
  return { name: $("#new-name").value, gpus: $("#new-gpus").value, processes: $("#new-processes").value, stages };
}

function notesList(notes) {
  return el("ul", { class: "notes" }, notes.map((n) => el("li", { class: n.level === "warning" || n.level === "error" ? "warn" : "" },
    el("b", {}, n.label ? `${n.label}: ` : ""), n.text)));
}

function showCheck(data) {
  const out = [el("h2", {}, "Before launch"), el("p", {}, "The command that runs it (the YAML is saved in the run's folder first):"),
    el("pre", { class: "code", id: "check-command" }, data.command), copyButton(data.command)];
  data.stages.forEach((s, i) => {
    const box = el("div", { class: "panel check-stage" }, el("h3", {}, `Stage ${i + 1}: ${s.task}`),
      el("p", {}, el("b", {}, "Plan: "), s.plan),
      notesList(s.notes), ...(s.fitted || []).map((f) => el("p", { class: "dim" }, f)),
      el("details", { open: true }, el("summary", {}, "YAML"), el("pre", { class: "code check-yaml" }, s.yaml), copyButton(s.yaml)));
    if (s.data) {
      const data = el("div", { class: "data-check" });
      data.innerHTML = s.data;  // the report's HTML: escaped on the server
      box.append(el("h3", {}, "Data check"), data);
    }
    for (const c of s.commands || []) box.append(el("p", { class: "dim" }, `# ${c.title}`), el("pre", { class: "code" }, c.lines.join("\n")), copyButton(c.lines.join("\n")));
    out.push(box);
  });
  $("#new-result").replaceChildren(...out);
}

async function check() {
  const data = await guarded($("#new-check"), $("#new-wait"), () => api("/api/check", formValues()));
  if (data) showCheck(data);
}

async function launch() {
  const data = await guarded($("#new-launch"), $("#new-wait"), () => api("/api/launch", formValues()));
  if (data) { $("#new-name").value = ""; location.hash = `#run=${encodeURIComponent(data.path)}`; }
}

// -- compare ---------------------------------------------------------------------------------------
async function showCompare(paths) {
  const found = await guarded(null, null, loadRuns);
  if (!found) return;
  $("#compare-pick").replaceChildren(...found.map((r) => el("label", {},
    el("input", { type: "checkbox", value: r.path, checked: paths.includes(r.path) }), ` ${r.path} `, badge(r.status))));
  if (paths.length) follow(paths);
}

function follow(paths) {
  if (state.source) state.source.close();
  const query = paths.map((p) => `paths=${encodeURIComponent(p)}`).join("&");
  const source = new EventSource(`/api/compare/events?${query}`);
  state.source = source;
  source.addEventListener("curves", (e) => { $("#compare-out").innerHTML = JSON.parse(e.data).html; });
}

// -- machine ---------------------------------------------------------------------------------------
async function machine() {
  const data = await guarded($("#machine-go"), $("#machine-wait"), () => api("/api/machine"));
  if (!data) return;
  const findings = el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, ""), el("th", {}, "finding"), el("th", {}, `fix (${data.shell})`))),
    el("tbody", {}, data.findings.map((f) => el("tr", { class: `finding ${f.severity}` }, el("td", {}, f.severity),
      el("td", {}, f.message), el("td", {}, f.fix ? [el("code", {}, f.fix), el("br"), copyButton(f.fix)] : "-")))));
  const plan = el("table", { class: "plan" }, el("tbody", {}, data.plan.choices.map((c) => el("tr", {}, c.map((v) => el("td", {}, v))))));
  const facts = el("table", { class: "plan" }, el("tbody", {}, data.facts.map((r) => el("tr", {}, r.map((v) => el("td", {}, v))))));
  $("#machine-out").replaceChildren(el("h2", {}, "Findings"), data.findings.length ? findings : el("p", {}, "No problems found."),
    el("h2", {}, "Plan"), el("p", {}, data.plan.summary), plan, el("h2", {}, "This machine"), facts);
}

async function smoke() {
  const data = await guarded($("#machine-smoke"), $("#machine-wait"), () => api("/api/machine/smoke", {}));
  if (data) $("#machine-out").prepend(el("p", { class: data.ok ? "line" : "line warn" }, data.line));
}

// -- wiring ----------------------------------------------------------------------------------------
function wire() {
  if (location.search.includes("token=")) history.replaceState(null, "", location.pathname + location.hash);  // kept in a cookie
  $("#runs-compare").addEventListener("click", () => {
    const ticked = [...document.querySelectorAll("#runs-table input:checked")].map((i) => i.dataset.path);
    location.hash = `#compare=${encodeURIComponent(ticked.join("|"))}`;
  });
  $("#run-stop").addEventListener("click", () => guarded($("#run-stop"), null, async () => {
    const answer = await api(`/api/run/stop?${runPath(state.run)}`, {});
    $("#run-line").textContent = answer.said;
  }));
  $("#run-resume").addEventListener("click", () => guarded($("#run-resume"), null, async () => {
    await api(`/api/run/resume?${runPath(state.run)}`, {});
    showRun(state.run);
  }));
  $("#run-report").addEventListener("click", () => guarded($("#run-report"), null, async () => {
    await api(`/api/run/report?${runPath(state.run)}`, {});
    $("#run-report-link").hidden = false;
  }));
  $("#run-chain").addEventListener("click", () => guarded(null, null, async () => {
    const chain = await api(`/api/chain?${runPath(state.run)}`);
    location.hash = `#compare=${encodeURIComponent(chain.paths.join("|"))}`;
  }));
  $("#try-go").addEventListener("click", () => guarded($("#try-go"), $("#try-wait"), tryRun));
  $("#export-go").addEventListener("click", () => guarded($("#export-go"), null, async () => {
    const types = [...document.querySelectorAll("#export-types input:checked")].map((i) => i.value);
    await api(`/api/run/export?${runPath(state.run)}`, { types, ollama: $("#export-ollama").checked });
    const data = await api(`/api/run?${runPath(state.run)}`);
    showExports(data.exports);
  }));
  $("#stage-add").addEventListener("click", addStage);
  $("#stage-remove").addEventListener("click", removeStage);
  $("#new-check").addEventListener("click", check);
  $("#new-launch").addEventListener("click", launch);
  $("#compare-go").addEventListener("click", () => {
    const ticked = [...document.querySelectorAll("#compare-pick input:checked")].map((i) => i.value);
    location.hash = `#compare=${encodeURIComponent(ticked.join("|"))}`;
  });
  $("#machine-go").addEventListener("click", machine);
  $("#machine-smoke").addEventListener("click", smoke);
  window.addEventListener("hashchange", route);
  api("/api/catalog").then(useCatalog).catch(say).finally(route);
}

document.addEventListener("DOMContentLoaded", wire);
