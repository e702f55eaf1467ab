// The Threadline console. Plain JavaScript, no dependency, talks only to this gateway.
// The answer stream is the thread's SSE stream (EventSource): the browser reconnects
// with Last-Event-ID after a drop, and the gateway resumes right after that event,
// so an answer goes on with no gap and no repeat. window.threadlineConsole exposes
// what the page saw, for the browser test.
"use strict";

const KEY_STORE = "threadline.key";
const EVENTS = [
  "run_accepted", "attempt_dispatched", "message_start", "text_start", "text_delta", "text_end",
  "step", "citations", "message_end", "retry_scheduled", "run_completed", "run_failed",
  "run_cancelled", "done", "message_not_streaming",
];
const TERMINAL = { run_completed: "completed", run_failed: "failed", run_cancelled: "cancelled" };
const seen = window.threadlineConsole = { events: [], opens: 0, errors: 0, finished: {} };

const $ = (id) => document.getElementById(id);
const el = (tag, props = {}, ...children) => {
  const node = Object.assign(document.createElement(tag), props);
  for (const child of children) node.append(child);
  return node;
};
const clock = (ms) => new Date(ms || Date.now()).toLocaleTimeString();

let key = sessionStorage.getItem(KEY_STORE);
let threadId = null;
let source = null;
let lastEventId = "";
let reopenTimer = null;
let activeRun = null;
let pollTimer = null;
let lastBeat = 0;
let beats = null; // the timeline entry counting the current attempt's heartbeats
let dropped = false;
let cursor = null;
const answers = new Map(); // run_id -> the answer's elements and text

async function api(method, path, body, headers = {}) {
  const response = await fetch(path, {
    method,
    headers: { Authorization: `Bearer ${key}`, ...(body ? { "Content-Type": "application/json" } : {}), ...headers },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (response.status === 401) signOut("That key was refused.");
  return { status: response.status, data };
}

function setConnection(state, text) {
  $("connection").dataset.state = state;
  $("connection").textContent = text;
}

// --- sign in ----------------------------------------------------------------------

function signOut(message) {
  key = null;
  sessionStorage.removeItem(KEY_STORE);
  closeStream();
  $("workspace").hidden = true;
  $("forget").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  setConnection("idle", "Not connected");
}

async function signIn() {
  const { status } = await api("GET", "/v1/threads?limit=1");
  if (status !== 200) return;
  $("login").hidden = true;
  $("workspace").hidden = false;
  $("forget").hidden = false;
  await loadThreads(true);
  const wanted = new URLSearchParams(location.hash.slice(1)).get("thread");
  if (wanted) await openThread(wanted);
}

// --- threads ----------------------------------------------------------------------

async function loadThreads(fresh) {
  if (fresh) { cursor = null; $("thread-list").replaceChildren(); }
  const query = cursor ? `&cursor=${encodeURIComponent(cursor)}` : "";
  const { status, data } = await api("GET", `/v1/threads?limit=10${query}`);
  if (status !== 200) return;
  for (const thread of data.threads) $("thread-list").append(threadItem(thread));
  cursor = data.next_cursor;
  $("more-threads").hidden = !cursor;
}

const threadDetails = (thread) => `${thread.message_count} messages · updated ${clock(thread.updated_at_ms)}`;

function threadItem(thread) {
  const button = el("button", { type: "button", className: "link", textContent: thread.title || "Untitled thread" });
  button.dataset.threadId = thread.thread_id;
  button.addEventListener("click", () => openThread(thread.thread_id));
  return el("li", {}, button, el("small", { textContent: threadDetails(thread) }));
}

// A run ended: the thread's entry shows its new message count.
async function refreshThreadItem(id) {
  try {
    const { status, data } = await api("GET", `/v1/threads/${encodeURIComponent(id)}`);
    const button = document.querySelector(`#thread-list button[data-thread-id="${id}"]`);
    if (status === 200 && button) button.nextElementSibling.textContent = threadDetails(data);
  } catch {
    // the gateway is away; the entry catches up after the next run
  }
}

async function createThread(title) {
  const { status, data } = await api("POST", "/v1/threads", { title });
  if (status !== 201 && status !== 202) return;
  $("thread-list").prepend(threadItem({ ...data, message_count: 0, updated_at_ms: Date.now() }));
  await openThread(data.thread_id);
}

// --- one thread -------------------------------------------------------------------

async function openThread(id) {
  const { status, data } = await api("GET", `/v1/threads/${encodeURIComponent(id)}`);
  if (status !== 200) { $("send-error").textContent = "That thread is not there."; return; }
  closeStream();
  threadId = id;
  history.replaceState(null, "", `#thread=${encodeURIComponent(id)}`);
  for (const b of document.querySelectorAll("#thread-list button")) {
    b.setAttribute("aria-current", String(b.dataset.threadId === id));
  }
  answers.clear();
  $("messages").replaceChildren();
  $("timeline").replaceChildren();
  $("chat-title").textContent = data.title || "Untitled thread";
  $("chat-id").textContent = `thread ${id}`;
  $("send").hidden = false;
  $("send-error").textContent = "";
  if (data.last_run && !data.active_run) {
    mark(`last run ${short(data.last_run.run_id)}: ${data.last_run.status} after ${data.last_run.attempts} attempt(s)`);
  }
  openStream(true);
}

function short(id) { return (id || "").slice(0, 8); }

function mark(text, when) {
  const item = el("li", {}, el("time", { textContent: clock(when) }), ` ${text}`);
  $("timeline").append(item);
  return item;
}

async function loadHistory() {
  const { status, data } = await api("GET", `/v1/threads/${encodeURIComponent(threadId)}/messages?before=end&limit=50`);
  if (status !== 200) return;
  const items = [];
  for (const m of data.messages) {
    if (m.role === "user") {
      if (!document.querySelector(`[data-message-id="${m.message_id}"]`)) items.push(userItem(m.message_id, m.text));
    } else if (!answers.has(m.run_id)) {
      const answer = answerItem(m.run_id, "completed");
      showMessage(answer, m);
      items.push(answer.li);
    }
  }
  $("messages").prepend(...items);
}

function userItem(messageId, text) {
  const li = el("li", { className: "msg user" }, el("span", { className: "who", textContent: "You" }),
    el("p", { className: "text", textContent: text }));
  li.dataset.messageId = messageId;
  return li;
}

function answerItem(runId, state) {
  const text = el("p", { className: "text" });
  const steps = el("ul", { className: "steps" });
  const sources = el("ul", { className: "sources" });
  const status = el("span", { className: "run-state" });
  const li = el("li", { className: "msg assistant" }, el("span", { className: "who", textContent: "Assistant" }),
    text, steps, sources, status);
  li.dataset.runId = runId;
  const answer = { li, text, steps, sources, status, streamed: "", attempt: 0 };
  answers.set(runId, answer);
  setAnswerState(answer, state);
  return answer;
}

function setAnswerState(answer, state) {
  answer.li.dataset.state = state;
  answer.li.setAttribute("aria-busy", String(state === "streaming" || state === "waiting"));
  answer.status.textContent = state === "completed" ? "" : state;
}

function addStep(answer, step) {
  const what = step.kind === "tool_result" ? "result of" : "tool call";
  answer.steps.append(el("li", { textContent: `${what} ${step.name}: ${step.payload_json}` }));
}

function addSources(answer, citations) {
  answer.sources.replaceChildren(...citations.map((c) =>
    el("li", {}, el("a", { href: c.url, textContent: c.title || c.url, rel: "noopener noreferrer" }))));
}

function showMessage(answer, message) {
  answer.text.textContent = message.text;
  answer.steps.replaceChildren();
  for (const step of message.steps || []) addStep(answer, step);
  addSources(answer, message.citations || []);
}

// --- the stream -------------------------------------------------------------------

function closeStream() {
  beats = null;
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
  es.onopen = () => {
    seen.opens++;
    setConnection("live", "Live");
    if (dropped) mark("reconnected: the stream goes on after the last event received");
    dropped = false;
    if (!loaded) { loaded = true; loadHistory(); }
  };
  es.onerror = () => {
    seen.errors++;
    setConnection("reconnecting", "Reconnecting…");
    if (!dropped) mark("connection lost; reconnecting");
    dropped = true;
    if (es.readyState === EventSource.CLOSED && source === es) {
      // The browser gave up (an error status): reopen after the last event ourselves.
      reopenTimer = setTimeout(() => { if (source === es) openStream(false); }, 1000);
    }
  };
  for (const name of EVENTS) es.addEventListener(name, (e) => onEvent(name, e));
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
    refreshThreadItem(threadId);
    return;
  }
  const runId = data.run_id;
  let answer = answers.get(runId);
  if (!answer) {
    answer = answerItem(runId, "waiting");
    $("messages").append(answer.li);
  }
  switch (name) {
    case "run_accepted":
      activeRun = runId;
      $("stop").disabled = false;
      mark(`run ${short(runId)} accepted`);
      startPolling();
      break;
    case "attempt_dispatched":
      mark(`attempt ${data.attempt} dispatched`);
      break;
    case "message_start":
      if (answer.streamed) mark(`attempt ${data.attempt} starts over; attempt ${answer.attempt}'s output is dropped`);
      mark(`attempt ${data.attempt} started`);
      answer.attempt = data.attempt;
      answer.streamed = "";
      answer.text.textContent = "";
      answer.steps.replaceChildren();
      answer.sources.replaceChildren();
      setAnswerState(answer, "streaming");
      break;
    case "text_delta":
      answer.streamed += data.delta;
      answer.text.textContent = answer.streamed;
      break;
    case "step":
      addStep(answer, data);
      break;
    case "citations":
      addSources(answer, data.citations);
      break;
    case "message_end":
      mark(`attempt ${data.attempt} finished its answer (${data.finish_reason})`);
      break;
    case "retry_scheduled":
      mark(`attempt ${data.attempt} failed: ${data.detail}; retry scheduled`);
      setAnswerState(answer, "retrying");
      break;
    default:
      if (TERMINAL[name]) finish(answer, runId, TERMINAL[name], data);
  }
}

function finish(answer, runId, state, data) {
  mark(`run ${short(runId)} ${state}${data.detail ? `: ${data.detail}` : ""}`);
  seen.finished[runId] = { state, streamed: answer.streamed, stored: data.message ? data.message.text : null };
  if (data.message) showMessage(answer, data.message);
  setAnswerState(answer, state);
}

// --- heartbeats: the thread's state, polled while a run is active -------------------

function startPolling() {
  stopPolling();
  lastBeat = 0;
  pollTimer = setInterval(poll, 1000);
}

function stopPolling() { clearInterval(pollTimer); pollTimer = null; }

async function poll() {
  if (!threadId || document.hidden) return;
  let status, data;
  try {
    ({ status, data } = await api("GET", `/v1/console/threads/${encodeURIComponent(threadId)}/run`));
  } catch {
    return; // the gateway is away: the connection status already says so
  }
  const run = status === 200 ? data.active_run : null;
  if (!run) return;
  if (run.status === "running" && run.last_heartbeat_ms > lastBeat && lastBeat !== 0) {
    // One entry an attempt, counting its heartbeats, rather than a line each.
    if (!beats || beats.attempt !== run.attempt) {
      beats = { attempt: run.attempt, count: 0, item: mark("") };
    }
    beats.count++;
    beats.item.replaceChildren(el("time", { textContent: clock(run.last_heartbeat_ms) }),
      ` heartbeat from attempt ${run.attempt} (${beats.count} so far)`);
  }
  lastBeat = Math.max(lastBeat, run.last_heartbeat_ms || 1);
}

// --- forms --------------------------------------------------------------------------

async function send(text) {
  $("send-error").textContent = "";
  const messageKey = crypto.randomUUID ? crypto.randomUUID() : String(Math.random()).slice(2);
  const { status, data } = await api("POST", `/v1/threads/${encodeURIComponent(threadId)}/user_message`,
    { input_text: text }, { "Idempotency-Key": messageKey });
  if (status === 202) {
    if (!document.querySelector(`[data-message-id="${data.message_id}"]`)) {
      const user = userItem(data.message_id, text);
      const answer = answers.get(data.run_id);
      if (answer) answer.li.before(user); else $("messages").append(user);
    }
    $("input").value = "";
  } else {
    $("send-error").textContent = (data && data.detail) || `The message was refused (${status}).`;
  }
}

async function stop() {
  if (!activeRun) return;
  const { status, data } = await api("POST",
    `/v1/threads/${encodeURIComponent(threadId)}/runs/${encodeURIComponent(activeRun)}/cancel`,
    { reason: "stopped from the console" });
  if (status !== 202) $("send-error").textContent = (data && data.detail) || `Stop refused (${status}).`;
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
  $("send").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("input").value;
    if (text.trim()) send(text);
  });
  $("stop").addEventListener("click", stop);
  if (key) signIn();
});
