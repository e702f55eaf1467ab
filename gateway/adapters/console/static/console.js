// The Threadline console. Plain JavaScript, no build step; talks only to this gateway.
// Answers are Markdown, rendered by marked and sanitized by DOMPurify (vendor/, pinned).
// The answer stream is the thread's SSE stream (EventSource): the browser reconnects
// with Last-Event-ID after a drop, and the gateway resumes right after that event,
// so an answer goes on with no gap and no repeat. The run timeline is made from the
// runs' own events and their records' times (`ts`): live from the stream, and for the
// runs that ended before the page was opened, from GET /v1/console/threads/{id}/runs,
// so a reload shows the same entries at the same times. window.threadlineConsole
// exposes what the page saw, for the browser test.
"use strict";

const KEY_STORE = "threadline.key";
const EVENTS = [
  "run_accepted", "attempt_dispatched", "message_start", "text_start", "text_delta", "text_end",
  "step", "citations", "message_end", "retry_scheduled", "interrupt", "run_completed",
  "run_failed", "run_cancelled", "done", "message_not_streaming",
];
const TERMINAL = { run_completed: "completed", run_failed: "failed", run_cancelled: "cancelled" };
// What the timeline shows of an event (gateway/adapters/console/timeline.py keeps the same).
const TIMELINE_EVENTS = new Set(["run_accepted", "attempt_dispatched", "message_start", "message_end",
  "retry_scheduled", "interrupt", "run_completed", "run_failed", "run_cancelled"]);
const TIMELINE_FIELDS = ["run_id", "attempt", "ts", "seq", "detail", "finish_reason"];
const WIDE = window.matchMedia("(min-width: 60em)");
const seen = window.threadlineConsole = { events: [], opens: 0, errors: 0, finished: {}, resumed: [] };

const $ = (id) => document.getElementById(id);
const el = (tag, props = {}, ...children) => {
  const node = Object.assign(document.createElement(tag), props);
  for (const child of children) node.append(child);
  return node;
};
const clock = (ms) => new Date(ms).toLocaleTimeString();
const plural = (n, one, many) => `${n} ${n === 1 ? one : many}`;
const short = (id) => (id || "").slice(0, 8);
const clip = (text, n) => (text.length > n ? `${text.slice(0, n - 1)}…` : text);

let key = sessionStorage.getItem(KEY_STORE);
let threadId = null;
let source = null;
let lastEventId = "";
let reopenTimer = null;
let activeRun = null;
let pollTimer = null;
let beats = null; // { attempt, count, last }: the active attempt's heartbeats seen
let dropped = false;
let cursor = null;
let pushed = false; // this page put the open thread on the history stack
let sendError = null; // { kind }: what the shown error is about, so it clears when that ends
const answers = new Map(); // run_id -> the answer's elements and text
const runs = new Map(); // run_id -> the run's timeline group

async function api(method, path, body, headers = {}) {
  const response = await fetch(path, {
    method,
    headers: { Authorization: `Bearer ${key}`, ...(body ? { "Content-Type": "application/json" } : {}), ...headers },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (response.status === 401) signOut("That key was refused.");
  return { status: response.status, data };
}

function setConnection(state, text) {
  $("connection").dataset.state = state;
  $("connection").textContent = text;
}

function showError(text, kind) {
  $("send-error").textContent = text;
  sendError = text ? { kind } : null;
}

function clearError(kind) {
  if (sendError && (!kind || sendError.kind === kind)) showError("");
}

// --- Markdown, sanitized ----------------------------------------------------------

const escapeHtml = (s) => String(s).replace(/[&<>"']/g,
  (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

// Raw HTML in an answer is shown as text; images become links (the page loads nothing
// from elsewhere); DOMPurify then removes whatever could run: scripts, event handlers,
// javascript: URLs. Links open in a new tab, without access to this one.
const renderMarkdown = (() => {
  if (!window.marked || !window.DOMPurify) return null;
  const md = new window.marked.Marked({ gfm: true, breaks: true, async: false });
  md.use({ renderer: {
    html: (token) => (token.block ? `<p>${escapeHtml(token.text)}</p>` : escapeHtml(token.text)),
    image: (token) => `<a href="${escapeHtml(token.href)}">${escapeHtml(token.text || token.href)}</a>`,
  } });
  const purify = window.DOMPurify;
  purify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") {
      node.setAttribute("rel", "noopener noreferrer nofollow");
      node.setAttribute("target", "_blank");
    }
  });
  const config = {
    FORBID_TAGS: ["style", "img", "svg", "math", "form", "input", "button", "textarea", "select",
      "iframe", "object", "embed", "video", "audio", "source", "picture"],
    FORBID_ATTR: ["style", "id", "name", "class"],
    ALLOW_DATA_ATTR: false,
  };
  return (text) => purify.sanitize(md.parse(text), config);
})();

function renderText(node, text) {
  if (renderMarkdown) node.innerHTML = renderMarkdown(text);
  else node.textContent = text; // the libraries did not load: plain text, still safe
}

// --- sign in ----------------------------------------------------------------------

function signOut(message) {
  key = null;
  sessionStorage.removeItem(KEY_STORE);
  closeThread();
  $("workspace").hidden = true;
  $("forget").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  setConnection("signed-out", "Signed out");
}

async function signIn() {
  setConnection("connecting", "Signing in…");
  let status;
  try {
    ({ status } = await api("GET", "/v1/threads?limit=1"));
  } catch {
    status = 0;
  }
  if (status !== 200) {
    if (key) {
      setConnection("signed-out", "Signed out");
      $("login-error").textContent = `The gateway did not answer (${status || "no connection"}).`;
    }
    return;
  }
  $("login").hidden = true;
  $("login-error").textContent = "";
  $("workspace").hidden = false;
  $("forget").hidden = false;
  setConnection("ready", "Signed in");
  await loadThreads(true);
  await route();
}

// --- threads ----------------------------------------------------------------------

async function loadThreads(fresh) {
  const query = !fresh && cursor ? `&cursor=${encodeURIComponent(cursor)}` : "";
  const { status, data } = await api("GET", `/v1/threads?limit=10${query}`);
  if (status !== 200) return;
  if (fresh) $("thread-list").replaceChildren();
  for (const thread of data.threads) {
    if (!threadButton(thread.thread_id)) $("thread-list").append(threadItem(thread));
  }
  cursor = data.next_cursor;
  $("more-threads").hidden = !cursor;
  markCurrent();
}

const threadButton = (id) => [...document.querySelectorAll("#thread-list button.thread")]
  .find((b) => b.dataset.threadId === id);
const titleOf = (thread) => thread.display_title || thread.title || "Untitled thread";
const threadMeta = (thread) =>
  `${plural(thread.message_count, "message", "messages")} · updated ${clock(thread.updated_at_ms || thread.created_at_ms)}`;

function threadItem(thread) {
  const button = el("button", { type: "button", className: "thread" },
    el("span", { className: "thread-title", textContent: titleOf(thread) }),
    el("span", { className: "thread-meta", textContent: threadMeta(thread) }));
  button.dataset.threadId = thread.thread_id;
  button.addEventListener("click", () => visit(thread.thread_id));
  return el("li", {}, button);
}

function showThreadItem(thread, toTop) {
  let button = threadButton(thread.thread_id);
  if (!button) {
    $("thread-list").prepend(threadItem(thread));
    button = threadButton(thread.thread_id);
  }
  button.querySelector(".thread-title").textContent = titleOf(thread);
  button.querySelector(".thread-meta").textContent = threadMeta(thread);
  if (toTop && button.parentElement !== $("thread-list").firstElementChild) {
    $("thread-list").prepend(button.parentElement); // most recently updated first
  }
  markCurrent();
}

function markCurrent() {
  for (const b of document.querySelectorAll("#thread-list button.thread")) {
    b.setAttribute("aria-current", String(b.dataset.threadId === threadId));
  }
}

// The thread changed (a message accepted, a run ended): its entry shows its title and
// message count as they are now.
async function refreshThread(id) {
  try {
    const { status, data } = await api("GET", `/v1/threads/${encodeURIComponent(id)}`);
    if (status !== 200) return;
    showThreadItem(data, true);
    if (id === threadId) $("chat-title").textContent = titleOf(data);
  } catch {
    // the gateway is away; the entry catches up at the next change
  }
}

async function createThread(title) {
  const { status, data } = await api("POST", "/v1/threads", { title });
  if (status !== 201 && status !== 202) return;
  showThreadItem({ ...data, message_count: 0, updated_at_ms: data.created_at_ms || Date.now() }, true);
  await visit(data.thread_id);
}

// --- which view: the list, or a thread (the URL's #thread=...) ----------------------

async function visit(id) {
  if (id !== threadId) {
    history.pushState(null, "", `#thread=${encodeURIComponent(id)}`);
    pushed = true;
  }
  await route();
  if (!WIDE.matches) $("chat-title").focus();
}

function backToList() {
  if (pushed) { history.back(); return; } // popstate routes
  history.replaceState(null, "", location.pathname + location.search);
  route();
}

async function route() {
  if (!key) return;
  const wanted = new URLSearchParams(location.hash.slice(1)).get("thread");
  if (!wanted) {
    const was = threadId;
    closeThread();
    $("workspace").dataset.view = "list";
    $("app").scrollTop = 0;
    const button = was && threadButton(was);
    if (button && !WIDE.matches) button.focus();
    return;
  }
  $("workspace").dataset.view = "chat";
  if (wanted !== threadId) await openThread(wanted);
  $("app").scrollTop = 0;
}

// --- one thread -------------------------------------------------------------------

function closeThread() {
  closeStream();
  threadId = null;
  answers.clear();
  runs.clear();
  $("messages").replaceChildren();
  $("timeline").replaceChildren();
  $("timeline-note").textContent = "";
  $("chat-title").textContent = "No thread selected";
  $("chat-id").textContent = "";
  $("chat-empty").hidden = false;
  $("send").hidden = true;
  showError("");
  markCurrent();
  if (key) setConnection("ready", "Signed in");
}

async function openThread(id) {
  closeThread();
  threadId = id;
  markCurrent();
  $("chat-empty").hidden = true;
  $("chat-title").textContent = "Loading…";
  const { status, data } = await api("GET", `/v1/threads/${encodeURIComponent(id)}`);
  if (threadId !== id) return;
  if (status !== 200) {
    $("chat-title").textContent = "Thread not found";
    showError(status === 404 ? "That thread is not there (deleted, or another tenant's)." :
      `The thread could not be read (${status}).`, "thread");
    return;
  }
  $("chat-title").textContent = titleOf(data);
  $("chat-id").textContent = `thread ${id}`;
  $("send").hidden = false;
  showThreadItem(data, false);
  openStream(true);
}

function userItem(messageId, text) {
  const li = el("li", { className: "msg user" }, el("span", { className: "who", textContent: "You" }),
    el("p", { className: "text plain", textContent: text }));
  li.dataset.messageId = messageId;
  return li;
}

function answerItem(runId, state) {
  const text = el("div", { className: "text" });
  const question = el("form", { className: "interrupt", hidden: true });
  const stepList = el("ol");
  const steps = el("details", { className: "steps", hidden: true }, el("summary"), stepList);
  const sourceList = el("ol");
  const sources = el("details", { className: "sources", hidden: true }, el("summary"), sourceList);
  const status = el("span", { className: "run-state" });
  const li = el("li", { className: "msg assistant" }, el("span", { className: "who", textContent: "Assistant" }),
    text, question, steps, sources, status);
  li.dataset.runId = runId;
  const answer = { li, text, question, steps, stepList, sources, sourceList, status, streamed: "",
    attempt: 0, rendering: false };
  answers.set(runId, answer);
  setAnswerState(answer, state);
  return answer;
}

const STATE_TEXT = {
  waiting: "waiting for a worker", streaming: "answering…", retrying: "retrying",
  interrupted: "waiting for your answer", resuming: "resuming", completed: "",
};

function setAnswerState(answer, state, detail) {
  answer.li.dataset.state = state;
  answer.li.setAttribute("aria-busy", String(["waiting", "streaming", "retrying", "resuming"].includes(state)));
  const text = state in STATE_TEXT ? STATE_TEXT[state] : state;
  answer.status.textContent = detail ? `${text}: ${detail}` : text;
}

// Re-render the answer's Markdown at most once a frame while it streams.
function renderAnswer(answer) {
  if (answer.rendering) return;
  answer.rendering = true;
  requestAnimationFrame(() => {
    answer.rendering = false;
    renderText(answer.text, answer.streamed);
    follow();
  });
}

function pretty(json) {
  try { return JSON.stringify(JSON.parse(json), null, 2); } catch { return json; }
}

function addStep(answer, step) {
  const what = step.kind === "tool_result" ? "Result of " : "Called ";
  answer.stepList.append(el("li", {}, el("p", {}, what, el("code", { textContent: step.name })),
    el("pre", {}, el("code", { textContent: pretty(step.payload_json) }))));
  const count = answer.stepList.children.length;
  answer.steps.querySelector("summary").textContent = `Tool steps (${count})`;
  answer.steps.hidden = false;
}

function safeUrl(url) {
  try {
    const parsed = new URL(url);
    return parsed.protocol === "https:" || parsed.protocol === "http:" ? parsed : null;
  } catch {
    return null;
  }
}

function addSources(answer, citations) {
  answer.sourceList.replaceChildren(...citations.map((c) => {
    const url = safeUrl(c.url);
    if (!url) return el("li", { textContent: `${c.title || ""} ${c.url}`.trim() });
    return el("li", {}, el("a", { href: url.href, textContent: c.title || url.href, rel: "noopener noreferrer nofollow",
      target: "_blank" }), " ", el("span", { className: "host", textContent: url.host }));
  }));
  answer.sources.querySelector("summary").textContent = `Sources (${citations.length})`;
  answer.sources.hidden = citations.length === 0;
}

function resetParts(answer) {
  answer.stepList.replaceChildren();
  answer.steps.hidden = true;
  addSources(answer, []);
}

function showMessage(answer, message) {
  answer.streamed = message.text;
  renderText(answer.text, message.text);
  resetParts(answer);
  for (const step of message.steps || []) addStep(answer, step);
  addSources(answer, message.citations || []);
}

async function loadHistory() {
  const id = threadId;
  const { status, data } = await api("GET", `/v1/threads/${encodeURIComponent(id)}/messages?before=end&limit=50`);
  if (status !== 200 || id !== threadId) return;
  const items = [];
  const answered = new Set(data.messages.filter((m) => m.role === "assistant").map((m) => m.run_id));
  for (const m of data.messages) {
    if (m.role === "user") {
      if (!document.querySelector(`[data-message-id="${CSS.escape(m.message_id)}"]`)) items.push(userItem(m.message_id, m.text));
      // A run that ended without an answer (failed, or cancelled before any text).
      if (["failed", "cancelled"].includes(m.run_status) && !answered.has(m.run_id) && !answers.has(m.run_id)) {
        const answer = answerItem(m.run_id, m.run_status);
        items.push(answer.li);
      }
    } else if (!answers.has(m.run_id)) {
      const answer = answerItem(m.run_id, m.partial ? "cancelled" : "completed");
      showMessage(answer, m);
      items.push(answer.li);
    }
  }
  $("messages").prepend(...items);
  follow(WIDE.matches); // a phone shows the thread from its heading
}

// Keep the newest message in view if the reader was already at the end.
function follow(force) {
  const box = WIDE.matches ? $("messages") : $("app");
  if (force || box.scrollHeight - box.scrollTop - box.clientHeight < 120) {
    box.scrollTop = box.scrollHeight;
  }
}

// --- interrupts -------------------------------------------------------------------

function question(detail) {
  let payload = detail;
  try { payload = JSON.parse(detail); } catch { /* a plain string */ }
  if (payload && typeof payload === "object" && typeof payload.question === "string") return payload.question;
  return typeof payload === "string" ? payload : JSON.stringify(payload);
}

function showInterrupt(answer, runId, detail) {
  const form = answer.question;
  const field = `resume-${runId}`;
  const error = el("p", { className: "error", role: "alert" });
  const input = el("input", { id: field, name: "value", type: "text", required: true, autocomplete: "off" });
  const approve = el("button", { type: "button", textContent: "Approve" });
  const reject = el("button", { type: "button", className: "quiet", textContent: "Reject" });
  form.replaceChildren(
    el("p", { className: "question" }, el("strong", { textContent: "The agent asks: " }),
      el("span", { textContent: question(detail) })),
    el("div", { className: "actions" }, approve, reject),
    el("label", { htmlFor: field, textContent: "Or answer with a value" }),
    el("div", { className: "inline" }, input, el("button", { type: "submit", textContent: "Send answer" })),
    error);
  form.setAttribute("aria-label", "Answer the agent");
  const answerWith = async (value) => {
    for (const b of form.querySelectorAll("button, input")) b.disabled = true;
    error.textContent = "";
    let status, data;
    try {
      ({ status, data } = await api("POST",
        `/v1/threads/${encodeURIComponent(threadId)}/runs/${encodeURIComponent(runId)}/resume`, { value }));
    } catch {
      status = 0;
    }
    if (status === 202) {
      seen.resumed.push({ run_id: runId, value });
      setAnswerState(answer, "resuming");
      return;
    }
    for (const b of form.querySelectorAll("button, input")) b.disabled = false;
    error.textContent = status === 409 ? "The run is no longer waiting for an answer."
      : (data && data.detail) || `The answer was refused (${status || "no connection"}).`;
  };
  approve.addEventListener("click", () => answerWith(true));
  reject.addEventListener("click", () => answerWith(false));
  form.onsubmit = (e) => {
    e.preventDefault();
    if (input.value.trim()) answerWith(input.value);
  };
  form.hidden = false;
  setAnswerState(answer, "interrupted");
}

function hideInterrupt(answer) {
  answer.question.hidden = true;
  answer.question.replaceChildren();
}

// --- the run timeline: the runs' own events, at their records' times ----------------

function timelineEntry(name, data) {
  if (!TIMELINE_EVENTS.has(name)) return null;
  const entry = { event: name };
  for (const field of TIMELINE_FIELDS) if (data[field] !== undefined && data[field] !== null) entry[field] = data[field];
  return entry;
}

function runGroup(runId, at) {
  let group = runs.get(runId);
  if (group) return group;
  const outcome = el("span", { className: "outcome" });
  const list = el("ol");
  const li = el("li", { className: "run" }, el("h3", {}, `Run ${short(runId)} `, outcome), list);
  li.dataset.runId = runId;
  group = { li, list, outcome, at: at || 0, seqs: new Set(), open: false };
  runs.set(runId, group);
  // Runs in the order they were accepted, however they reached the page.
  const later = [...runs.values()].find((g) => g !== group && g.at > group.at && g.li.isConnected);
  $("timeline").insertBefore(li, later ? later.li : null);
  return group;
}

function setOutcome(group, text, state) {
  group.outcome.textContent = text ? `· ${text}` : "";
  group.outcome.className = `outcome outcome-${state || "active"}`;
}

function describe(entry, group) {
  const a = entry.attempt;
  switch (entry.event) {
    case "run_accepted": return "accepted";
    case "attempt_dispatched":
      if (group.waiting) { group.waiting = false; return `answered; attempt ${a} dispatched again`; }
      return `attempt ${a} dispatched`;
    case "message_start": {
      const over = group.open;
      group.open = true;
      return over ? `attempt ${a} started over; the earlier output is dropped` : `attempt ${a} started`;
    }
    case "message_end":
      group.open = false;
      return `attempt ${a} ended its answer (${entry.finish_reason || "stop"})`;
    case "retry_scheduled": return `attempt ${a} failed: ${entry.detail || "no detail"}; retry scheduled`;
    case "interrupt":
      group.waiting = true;
      return `interrupted: the agent asks “${clip(question(entry.detail || ""), 140)}”`;
    case "run_completed": return "completed";
    default: return `${TERMINAL[entry.event]}${entry.detail ? `: ${entry.detail}` : ""}`;
  }
}

function addToTimeline(entry) {
  const at = entry.ts ? Date.parse(entry.ts) : 0;
  const group = runGroup(entry.run_id, at);
  if (entry.seq && group.seqs.has(entry.seq)) return; // one event, two paths (stream and history)
  if (entry.seq) group.seqs.add(entry.seq);
  const item = el("li", {}, el("time", { dateTime: entry.ts || "", title: entry.ts || "",
    textContent: at ? clock(at) : "--:--:--" }), ` ${describe(entry, group)}`);
  item.dataset.seq = entry.seq || "";
  item.dataset.event = entry.event;
  group.list.append(item);
  if (TERMINAL[entry.event]) {
    group.ended = true;
    setOutcome(group, TERMINAL[entry.event], TERMINAL[entry.event]);
  } else if (!group.ended) {
    setOutcome(group, entry.event === "interrupt" ? "waiting for an answer" : "active", "active");
  }
}

// The runs that ended before this page read the thread's stream, from the server.
async function loadRuns() {
  const id = threadId;
  let status, data;
  try {
    ({ status, data } = await api("GET", `/v1/console/threads/${encodeURIComponent(id)}/runs?limit=25`));
  } catch {
    status = 0;
  }
  if (id !== threadId) return;
  if (status !== 200) {
    $("timeline-note").textContent = `Earlier runs could not be read (${status || "no connection"}).`;
    return;
  }
  for (const run of data.runs) {
    if (!run.retained) {
      const group = runGroup(run.run_id, run.accepted_at_ms || 1);
      if (!group.list.children.length) {
        group.list.append(el("li", { textContent: "its events are no longer kept by the stream topic" }));
      }
      setOutcome(group, run.status, run.status);
    }
    for (const entry of run.events) addToTimeline({ run_id: run.run_id, ...entry });
    const answer = answers.get(run.run_id);
    const end = run.events.find((e) => TERMINAL[e.event]);
    if (answer && end && end.detail && answer.li.dataset.state !== "completed") {
      setAnswerState(answer, TERMINAL[end.event], end.detail);
    }
  }
  $("timeline-note").textContent = data.more ? "Older runs are not shown." : "";
}

// --- the stream -------------------------------------------------------------------

function closeStream() {
  dropped = false;
  if (source) source.close();
  source = null;
  clearTimeout(reopenTimer);
  stopPolling();
  lastEventId = "";
  activeRun = null;
  $("stop").disabled = true;
}

function openStream(first) {
  const resume = lastEventId ? `&last_event_id=${encodeURIComponent(lastEventId)}` : "";
  const es = source = new EventSource(
    `/v1/threads/${encodeURIComponent(threadId)}/stream?access_token=${encodeURIComponent(key)}${resume}`);
  let loaded = !first;
  if (first) setConnection("connecting", "Connecting…");
  es.onopen = () => {
    seen.opens++;
    setConnection("live", "Live");
    dropped = false;
    if (!loaded) {
      loaded = true;
      loadHistory().then(loadRuns);
    }
  };
  es.onerror = () => {
    seen.errors++;
    setConnection("reconnecting", "Reconnecting…");
    dropped = true;
    if (es.readyState === EventSource.CLOSED && source === es) {
      // The browser gave up (an error status): reopen after the last event ourselves.
      reopenTimer = setTimeout(() => { if (source === es) openStream(false); }, 1000);
    }
  };
  for (const name of EVENTS) es.addEventListener(name, (e) => { if (source === es) onEvent(name, e); });
}

function onEvent(name, e) {
  if (e.lastEventId) lastEventId = e.lastEventId;
  const data = e.data === "[DONE]" ? {} : JSON.parse(e.data);
  seen.events.push({ type: name, id: e.lastEventId, run_id: data.run_id || activeRun, data: e.data });
  if (name === "message_not_streaming") { loadHistory(); return; }
  if (name === "done") {
    activeRun = null;
    $("stop").disabled = true;
    stopPolling();
    clearError("run-active"); // "another run is active" no longer holds
    refreshThread(threadId);
    return;
  }
  const runId = data.run_id;
  const entry = timelineEntry(name, data);
  if (entry) addToTimeline(entry);
  let answer = answers.get(runId);
  if (!answer) {
    answer = answerItem(runId, "waiting");
    $("messages").append(answer.li);
    follow();
  }
  switch (name) {
    case "run_accepted":
      activeRun = runId;
      $("stop").disabled = false;
      startPolling();
      refreshThread(threadId); // the user message is stored: the count goes up now
      break;
    case "attempt_dispatched":
      hideInterrupt(answer);
      if (answer.li.dataset.state !== "streaming") setAnswerState(answer, "waiting");
      startPolling();
      break;
    case "message_start":
      answer.attempt = data.attempt;
      answer.streamed = "";
      answer.text.replaceChildren();
      resetParts(answer);
      setAnswerState(answer, "streaming");
      break;
    case "text_delta":
      answer.streamed += data.delta;
      renderAnswer(answer);
      break;
    case "step":
      addStep(answer, data);
      break;
    case "citations":
      addSources(answer, data.citations);
      break;
    case "retry_scheduled":
      setAnswerState(answer, "retrying", data.detail);
      break;
    case "interrupt":
      stopPolling(); // no worker holds an interrupted run: no heartbeats
      showInterrupt(answer, runId, data.detail || "");
      break;
    default:
      if (TERMINAL[name]) finish(answer, runId, TERMINAL[name], data);
  }
}

function finish(answer, runId, state, data) {
  hideInterrupt(answer);
  seen.finished[runId] = { state, streamed: answer.streamed, stored: data.message ? data.message.text : null };
  if (data.message) showMessage(answer, data.message);
  setAnswerState(answer, state, state === "completed" ? "" : data.detail);
  follow();
}

// --- heartbeats: the active attempt's liveness, polled while it runs ----------------

function startPolling() {
  if (pollTimer) return;
  beats = null;
  pollTimer = setInterval(poll, 1000);
}

function stopPolling() {
  clearInterval(pollTimer);
  pollTimer = null;
  beats = null;
  $("liveness").hidden = true;
}

async function poll() {
  if (!threadId || document.hidden) return;
  let status, data;
  try {
    ({ status, data } = await api("GET", `/v1/console/threads/${encodeURIComponent(threadId)}/run`));
  } catch {
    return; // the gateway is away: the connection status already says so
  }
  const run = status === 200 ? data.active_run : null;
  if (!pollTimer || !run || run.status !== "running" || !run.last_heartbeat_ms) return;
  if (!beats || beats.attempt !== run.attempt) beats = { attempt: run.attempt, count: 0, last: 0 };
  if (run.last_heartbeat_ms > beats.last) {
    beats.count++;
    beats.last = run.last_heartbeat_ms;
  }
  $("liveness").textContent = `Attempt ${run.attempt} is alive: last heartbeat at ${clock(beats.last)} ` +
    `(${plural(beats.count, "heartbeat", "heartbeats")} seen here)`;
  $("liveness").hidden = false;
}

// --- forms --------------------------------------------------------------------------

async function send(text) {
  const id = threadId;
  const messageKey = crypto.randomUUID ? crypto.randomUUID() : String(Math.random()).slice(2);
  let status, data;
  try {
    ({ status, data } = await api("POST", `/v1/threads/${encodeURIComponent(id)}/user_message`,
      { input_text: text }, { "Idempotency-Key": messageKey }));
  } catch {
    showError("The gateway did not answer; the message may not have been sent.", "send");
    return;
  }
  if (id !== threadId) return;
  if (status === 202) {
    clearError();
    if (!document.querySelector(`[data-message-id="${CSS.escape(data.message_id)}"]`)) {
      const user = userItem(data.message_id, text);
      const answer = answers.get(data.run_id);
      if (answer) answer.li.before(user); else $("messages").append(user);
      follow(true);
    }
    $("input").value = "";
    refreshThread(id);
  } else if (status === 409) {
    showError((data && data.detail) || "Another run is active on this thread.", "run-active");
  } else {
    showError((data && data.detail) || `The message was refused (${status}).`, "send");
  }
}

async function stop() {
  if (!activeRun) return;
  const { status, data } = await api("POST",
    `/v1/threads/${encodeURIComponent(threadId)}/runs/${encodeURIComponent(activeRun)}/cancel`,
    { reason: "stopped from the console" });
  if (status === 202) clearError("run-active");
  else showError((data && data.detail) || `Stop refused (${status}).`, "stop");
}

document.addEventListener("DOMContentLoaded", () => {
  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    key = $("key").value.trim();
    sessionStorage.setItem(KEY_STORE, key);
    $("key").value = "";
    signIn();
  });
  $("forget").addEventListener("click", () => signOut("Key forgotten."));
  $("new-thread").addEventListener("submit", (e) => {
    e.preventDefault();
    createThread($("title").value.trim());
    $("title").value = "";
  });
  $("more-threads").addEventListener("click", () => loadThreads(false));
  $("back").addEventListener("click", backToList);
  $("send").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("input").value;
    if (text.trim()) send(text);
  });
  $("stop").addEventListener("click", stop);
  window.addEventListener("popstate", () => { pushed = false; route(); });
  window.addEventListener("hashchange", () => route()); // a link or a typed URL
  if (key) signIn();
});
