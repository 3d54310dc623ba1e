// The pico session inspector: plain JS, no build step (docs/inspector.md).
"use strict";

const state = {
  token: null,
  config: { allow_decisions: false },
  session: null,
  conversation: null,
  conversations: [],
  lastEntryId: 0,
  context: new Set(),
  auditNext: 0,
  auditDone: false,
  source: null,
  commits: 0,
};

const $ = (id) => document.getElementById(id);

// The token comes once from ?token=...; it is kept for this tab and taken out of the URL.
(function takeToken() {
  const params = new URLSearchParams(window.location.search);
  const given = params.get("token");
  if (given) {
    sessionStorage.setItem("pico-token", given);
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", window.location.pathname + (rest ? "?" + rest : ""));
  }
  state.token = sessionStorage.getItem("pico-token");
})();

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

async function api(path, options = {}) {
  const headers = Object.assign({ Accept: "application/json" }, options.headers || {});
  if (state.token) headers.Authorization = "Bearer " + state.token;
  const response = await fetch(path, Object.assign({}, options, { headers }));
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = new Error(body.error || response.status + " " + response.statusText);
    error.status = response.status;
    throw error;
  }
  return body;
}

const enc = encodeURIComponent;
const sessionPath = () => "/api/sessions/" + enc(state.session);
const convPath = () => sessionPath() + "/conversations/" + state.conversation;

function text(content) {
  if (typeof content === "string") return content;
  if (content && typeof content === "object") {
    const parts = [];
    const t = content.text !== undefined ? content.text : content.content;
    if (typeof t === "string" && t) parts.push(t);
    if (Array.isArray(content.tool_calls)) {
      parts.push("-> " + content.tool_calls.map((c) => c.name + "(" + JSON.stringify(c.arguments) + ")").join(", "));
    }
    if (content.is_error === true) parts.push("(error)");
    if (parts.length) return parts.join(" ");
  }
  return JSON.stringify(content);
}

function el(tag, attrs = {}, children = []) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") node.textContent = v;
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) node.appendChild(child);
  return node;
}

// ------------------------------------------------------------------ sessions
async function loadSessions() {
  const { items } = await api("/api/sessions");
  const select = $("session-select");
  select.replaceChildren(...items.map((s) => el("option", { value: s.name, text: s.name, "data-testid": "session-option" })));
  const wanted = new URLSearchParams(window.location.search).get("session");
  const chosen = items.find((s) => s.name === wanted) || items[0];
  if (chosen) {
    select.value = chosen.name;
    await selectSession(chosen.name);
  } else {
    showError("no sessions in this storage yet");
  }
}

async function selectSession(name) {
  state.session = name;
  await loadConversations();
  await Promise.all([loadTasks(), loadApprovals(), loadAudit(true)]);
}

// ------------------------------------------------------------------ conversations and the fork tree
async function loadConversations() {
  const all = [];
  let after = null;
  let rootId = null;
  do {
    const page = await api(sessionPath() + "/conversations?limit=1000" + (after === null ? "" : "&after=" + after));
    all.push(...page.items);
    rootId = page.root_id;
    after = page.next;
  } while (after !== null && after !== undefined);
  state.conversations = all;
  renderTree();
  const keep = all.find((c) => c.id === state.conversation);
  const first = keep || all.find((c) => c.id === rootId) || all[0];
  if (first) await selectConversation(first.id);
}

function renderTree() {
  const byId = new Map(state.conversations.map((c) => [c.id, c]));
  const children = new Map();
  const roots = [];
  for (const c of state.conversations) {
    const parent = c.source ? c.source.conversation_id : null;
    if (parent !== null && byId.has(parent)) {
      if (!children.has(parent)) children.set(parent, []);
      children.get(parent).push(c);
    } else roots.push(c);
  }
  const item = (c) => {
    const button = el("button", { id: "conversation-" + c.id, text: "conversation " + c.id });
    button.addEventListener("click", () => selectConversation(c.id).catch((e) => showError(e.message)));
    const li = el("li", {
      "data-testid": "conversation",
      "data-conversation-id": String(c.id),
      "data-source-id": c.source ? String(c.source.conversation_id) : "",
      class: c.id === state.conversation ? "selected" : "",
    }, [button]);
    if (c.source) li.appendChild(el("span", { class: "fork-note", text: " fork of " + c.source.conversation_id + " as of " + c.source.as_of }));
    if (c.owner_task_id !== null) li.appendChild(el("span", { class: "owner-note", "data-testid": "owner-task", text: " owned by task " + c.owner_task_id }));
    if (c.deleted) li.appendChild(el("span", { class: "fork-note", text: " (deleted)" }));
    const kids = children.get(c.id);
    if (kids) li.appendChild(el("ul", {}, kids.map(item)));
    return li;
  };
  $("conversation-tree").replaceChildren(...roots.map(item));
}

// ------------------------------------------------------------------ the transcript
async function selectConversation(id) {
  state.conversation = id;
  state.lastEntryId = 0;
  renderTree();
  $("transcript-title").textContent = "conversation " + id;
  $("transcript").replaceChildren();
  await loadContext();
  await loadEntries();
  follow();
}

async function loadEntries() {
  let after = state.lastEntryId || null;
  do {
    const page = await api(convPath() + "/entries?limit=1000" + (after === null ? "" : "&after=" + after));
    for (const e of page.items) addEntry(e);
    after = page.next;
  } while (after !== null && after !== undefined);
}

function addEntry(e) {
  if (e.id <= state.lastEntryId || $("entry-" + e.id)) return;
  state.lastEntryId = Math.max(state.lastEntryId, e.id);
  const li = el("li", {
    id: "entry-" + e.id,
    "data-testid": "entry",
    "data-entry-id": String(e.id),
    "data-kind": e.kind,
  }, [
    el("span", { class: "meta", text: "#" + e.id + " " + e.kind + (e.conversation_id !== state.conversation ? " [from " + e.conversation_id + "]" : "") }),
    el("span", { class: "content", "data-testid": "entry-content", text: text(e.content) }),
  ]);
  if (e.kind === "summary") li.classList.add("summary");
  markEntry(li);
  $("transcript").appendChild(li);
}

function markEntry(li) {
  const inContext = state.context.has(Number(li.dataset.entryId));
  li.classList.toggle("in-context", inContext);
  li.dataset.inContext = inContext ? "true" : "false";
}

async function loadContext() {
  const asOf = $("context-as-of").value;
  const body = await api(convPath() + "/context" + (asOf === "" ? "" : "?as_of=" + enc(asOf)));
  state.context = new Set(body.context);
  $("context-summary").textContent = body.context.length + " entries in context as of position " + body.as_of;
  for (const li of $("transcript").children) markEntry(li);
}

// ------------------------------------------------------------------ tasks, approvals, events
async function loadTasks() {
  const rows = [];
  let after = null;
  do {
    const page = await api(sessionPath() + "/tasks?live=true&limit=1000" + (after === null ? "" : "&after=" + after));
    rows.push(...page.items);
    after = page.next;
  } while (after !== null && after !== undefined);
  $("tasks").tBodies[0].replaceChildren(...rows.map((t) => el("tr", {
    id: "task-" + t.id, "data-testid": "task", "data-task-id": String(t.id), "data-status": t.status,
  }, [t.id, t.kind, t.status, t.role, t.conversation_id].map((v) => el("td", { text: String(v) })))));
}

async function loadApprovals() {
  const { items } = await api(sessionPath() + "/approvals");
  $("approvals").replaceChildren(...items.map((t) => {
    const call = t.state && typeof t.state === "object" ? (t.state.call || t.state.tool_call || t.state) : t.state;
    const li = el("li", { id: "approval-" + t.id, "data-testid": "approval", "data-task-id": String(t.id) }, [
      el("span", { text: "task " + t.id + " (conversation " + t.conversation_id + "): " + JSON.stringify(call).slice(0, 200) }),
    ]);
    if (state.config.allow_decisions) {
      for (const decision of ["grant", "deny"]) {
        const b = el("button", { id: decision + "-" + t.id, "data-testid": decision, text: decision === "grant" ? "Grant" : "Deny" });
        b.addEventListener("click", () => decide(t.id, decision));
        li.appendChild(b);
      }
    }
    return li;
  }));
}

async function decide(taskId, decision) {
  try {
    await api(sessionPath() + "/approvals/" + taskId, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ decision }),
    });
    showError("");
    await loadApprovals();
  } catch (e) {
    showError(e.message);
  }
}

async function loadAudit(fresh) {
  if (fresh) {
    state.auditNext = 0;
    state.auditDone = false;
    $("audit").tBodies[0].replaceChildren();
  }
  const page = await api(sessionPath() + "/audit?limit=200&after=" + state.auditNext);
  const body = $("audit").tBodies[0];
  for (const r of page.items) {
    body.appendChild(el("tr", { "data-testid": "audit-row", "data-position": String(r.position) },
      [r.position, r.event, r.aggregate, r.at || ""].map((v) => el("td", { text: String(v) }))));
    state.auditNext = r.position;
  }
  state.auditDone = page.next === null;
  $("audit-more").hidden = state.auditDone;
}

// ------------------------------------------------------------------ following the session live
function setLive(s, label) {
  const node = $("live-status");
  node.dataset.state = s;
  node.textContent = label;
}

function follow() {
  if (state.source) state.source.close();
  const url = convPath() + "/watch" + (state.token ? "?token=" + enc(state.token) : "");
  const source = new EventSource(url);
  state.source = source;
  const mine = () => state.source === source;
  source.addEventListener("base", () => {
    if (!mine()) return;
    setLive("live", "live");
    refresh().catch((e) => showError(e.message));
  });
  source.addEventListener("commit", () => {
    if (!mine()) return;
    state.commits += 1;
    document.body.dataset.commits = String(state.commits);
    refresh().catch((e) => showError(e.message));
  });
  source.addEventListener("signal", (msg) => {
    if (!mine()) return;
    const signal = JSON.parse(msg.data);
    if (signal.kind === "rebind" || signal.kind === "fault") {
      setLive("reconnecting", "reconnecting (" + signal.kind + ")");
      source.close();
      setTimeout(() => { if (mine()) follow(); }, 1000);
    } else if (signal.kind === "idle") {
      loadTasks().catch((e) => showError(e.message));
    }
  });
  source.onerror = () => { if (mine()) setLive("reconnecting", "reconnecting"); };
}

let refreshing = null;
let again = false;
// One refresh at a time; a commit during a refresh runs one more (nothing is missed).
async function refresh() {
  if (refreshing) { again = true; return refreshing; }
  refreshing = (async () => {
    do {
      again = false;
      await loadEntries();
      if ($("context-as-of").value === "") await loadContext();
      await Promise.all([loadTasks(), loadApprovals(), state.auditDone ? loadAudit(false) : Promise.resolve()]);
      const known = new Set(state.conversations.map((c) => c.id));
      const page = await api(sessionPath() + "/conversations?limit=1000");
      if (page.items.some((c) => !known.has(c.id))) {
        state.conversations = page.items;
        renderTree();
      }
    } while (again);
  })();
  try { await refreshing; } finally { refreshing = null; }
}

// ------------------------------------------------------------------ start
async function start() {
  state.config = await api("/api/config");
  $("decisions-mode").textContent = state.config.allow_decisions ? "decisions allowed" : "read-only";
  $("decisions-mode").dataset.allowDecisions = state.config.allow_decisions ? "true" : "false";
  $("session-select").addEventListener("change", (e) => selectSession(e.target.value).catch((x) => showError(x.message)));
  $("context-as-of").addEventListener("change", () => loadContext().catch((e) => showError(e.message)));
  $("audit-more").addEventListener("click", () => loadAudit(false).catch((e) => showError(e.message)));
  await loadSessions();
  document.body.dataset.ready = "true";
}

start().catch((e) => showError(e.status === 401 ? "this inspector needs its token: open the page with ?token=<token>" : e.message));
